//! Prints the program pcaptool runs for a filter on a link type: `cargo run -p pcaptool-query --example listing -- 1 'tcp port 80'`.

fn main() {
    let mut args = std::env::args().skip(1);
    let lt: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let text: Vec<String> = args.collect();
    let filter = match pcaptool_query::Filter::new(&text.join(" ")) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    match filter.compile(pcaptool_query::Target::new(pcaptool_packet::LinkType(lt))) {
        Ok(m) => print!("{}", m.listing()),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

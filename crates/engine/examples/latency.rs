//! Times answers to one filter from a long-lived source in this process (the engine alone, as the service
//! holds it, without HTTP): `cargo run --release -p pcaptool-engine --example latency -- TRACE FILTER [N]`
//! prints the p50 and the best of N answers (default 100), each written as pcap and discarded.

use std::time::{Duration, Instant};

use pcaptool_engine::{OpenOptions, Request, Source, TraceSink, WriteOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(filter)) = (args.first(), args.get(1)) else {
        return Err("usage: latency TRACE FILTER [N]".into());
    };
    let n: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(100).max(1);
    let source = Source::open_with(path, &OpenOptions::new().long_lived(true))?;
    let req = Request::filter(filter)?;
    let mut times = Vec::with_capacity(n);
    let mut matched = 0;
    // (One answer first, unmeasured: it loads the parts of the index the filter needs.)
    for i in 0..=n {
        let t = Instant::now();
        let mut sink = TraceSink::to_writer(Box::new(std::io::sink()), "nowhere", WriteOptions::new().gather(false));
        matched = source.run(&req, &mut sink)?.matched;
        if i > 0 {
            times.push(t.elapsed());
        }
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "`{filter}`: {matched} packets, p50 {:.3} ms, best {:.3} ms ({n} answers)",
        ms(times[n / 2]),
        ms(times[0])
    );
    Ok(())
}

//! `engine-user SOURCE FILTER OUT`: writes the packets of SOURCE (a trace, an indexed trace or a flow store)
//! that FILTER selects to OUT, and prints how many and how the engine answered.

use std::process::ExitCode;

use pcaptool_engine::{Request, Source, TraceSink, WriteOptions};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [source, filter, out] = args.as_slice() else {
        eprintln!("usage: engine-user SOURCE FILTER OUT");
        return ExitCode::from(2);
    };
    let run = || -> Result<(u64, String), Box<dyn std::error::Error>> {
        let source = Source::open(source)?;
        let req = Request::filter(filter)?;
        let plan = source.plan(&req)?;
        let outcome = source.run(&req, &mut TraceSink::create(out.as_ref(), WriteOptions::new())?)?;
        Ok((outcome.matched, format!("{:?} {:?}", plan.kind, plan.strategy)))
    };
    match run() {
        Ok((matched, how)) => {
            println!("{matched} {how}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("engine-user: {e}");
            ExitCode::FAILURE
        }
    }
}

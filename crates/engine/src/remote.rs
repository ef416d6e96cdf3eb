//! Sources answered elsewhere: a `pcaptool serve` on another host, reached by a client outside the engine (the
//! `pcaptool-remote` crate), so that the engine holds no network code. The engine gives such a source the
//! request and takes its records like any other source's, which lets [`Source::merged`](crate::Source::merged)
//! fan one request out over sensors.

use crate::plan::Plan;
use crate::{Error, FlowRecord, Outcome, Request, Sink};

/// A source whose answers come from elsewhere.
///
/// Implementations send the request (its filter's text, time window, limit, flow) and give the answer's records
/// to the sink in the remote's order, calling [`Sink::begin`] first and [`Sink::finish`] last, as the engine's own
/// sources do; they look at the request's cancel flag while they wait, and fail with [`Error::Remote`] (naming
/// the source) when the remote cannot be reached, refuses, or breaks off its answer.
///
/// ```
/// use pcaptool_engine::{Error, FlowRecord, Outcome, Plan, Remote, Request, Sink, Source, SourceKind};
///
/// /// A remote that is never there.
/// #[derive(Debug)]
/// struct Away;
///
/// impl Remote for Away {
///     fn name(&self) -> &str { "https://sensor.example:8740" }
///     fn plan(&self, _: &Request) -> Result<Plan, Error> { Err(self.down()) }
///     fn run(&self, _: &Request, _: &mut dyn Sink) -> Result<Outcome, Error> { Err(self.down()) }
///     fn flows(&self, _: &Request) -> Result<Vec<FlowRecord>, Error> { Err(self.down()) }
/// }
///
/// impl Away {
///     fn down(&self) -> Error {
///         Error::Remote { name: self.name().into(), source: "connection refused".into() }
///     }
/// }
///
/// let source = Source::remote(std::sync::Arc::new(Away));
/// assert_eq!(source.kind(), SourceKind::Remote);
/// let err = source.count(&Request::filter("tcp")?).unwrap_err();
/// assert_eq!(err.to_string(), "https://sensor.example:8740");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Remote: Send + Sync + std::fmt::Debug {
    /// Its name: the address it is reached at (shown as the source's path and in errors).
    fn name(&self) -> &str;
    /// How the remote would answer `req` (its own plan).
    fn plan(&self, req: &Request) -> Result<Plan, Error>;
    /// Answers `req` into `sink` (with `req.count_only`, only [`Outcome::matched`] matters and the sink gets no
    /// records).
    fn run(&self, req: &Request, sink: &mut dyn Sink) -> Result<Outcome, Error>;
    /// The remote's flows that `req` may match.
    fn flows(&self, req: &Request) -> Result<Vec<FlowRecord>, Error>;
}

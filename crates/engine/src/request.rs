//! What is asked of a source.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pcaptool_packet::{Field, Need, Pred};
use pcaptool_query::Filter;

use crate::Error;

/// One question to a source: which packets (a filter in tcpdump's language, a time window, a flow), how many,
/// and whether only their number is wanted.
///
/// ```
/// use pcaptool_engine::Request;
///
/// let req = Request::filter("tcp port 443")?.after(1_700_000_000_000_000_000).limit(10);
/// assert_eq!(req.limit, Some(10));
/// # Ok::<(), pcaptool_engine::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Request {
    /// The filter (`None`: every packet).
    pub filter: Option<Filter>,
    /// Only packets at or after this time (ns since the Unix epoch).
    pub after: Option<u64>,
    /// Only packets before this time (ns).
    pub before: Option<u64>,
    /// Stop after this many matching packets (the first ones, in the answer's order).
    pub limit: Option<u64>,
    /// Only the packets of this flow (a store's flow id, see `Store::flows`).
    pub flow: Option<u64>,
    /// Only the number of matches is wanted: the engine may count from an index without reading packets, and
    /// the sink gets no records.
    pub count_only: bool,
    /// Stops the answer when set (by another thread): the engine looks between batches of packets, then fails
    /// with [`Error::Cancelled`].
    pub cancel: Option<Cancel>,
}

/// A flag that stops an answer in progress: a service sets it when its client goes away, so that the work stops
/// even while no match is being written. Clones share the flag.
///
/// ```
/// use pcaptool_engine::{Cancel, Request};
///
/// let cancel = Cancel::new();
/// let req = Request::filter("tcp")?.with_cancel(cancel.clone());
/// cancel.cancel();
/// assert!(req.cancel.as_ref().is_some_and(Cancel::is_cancelled));
/// # Ok::<(), pcaptool_engine::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag not set.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Sets it: every answer of a request holding it stops at its next check.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether it is set.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl Request {
    /// Every packet.
    pub fn new() -> Request {
        Request::default()
    }

    /// The packets a filter in tcpdump's language selects (empty text: every packet).
    pub fn filter(text: &str) -> Result<Request, Error> {
        Ok(Request::new().with_filter(Filter::new(text).map_err(Error::Filter)?))
    }

    /// Sets the filter.
    pub fn with_filter(mut self, filter: Filter) -> Request {
        self.filter = Some(filter);
        self
    }

    /// Packets at or after `ns`.
    pub fn after(mut self, ns: u64) -> Request {
        self.after = Some(ns);
        self
    }

    /// Packets before `ns`.
    pub fn before(mut self, ns: u64) -> Request {
        self.before = Some(ns);
        self
    }

    /// At most `n` matches.
    pub fn limit(mut self, n: u64) -> Request {
        self.limit = Some(n);
        self
    }

    /// The packets of the store's flow `id`.
    pub fn flow(mut self, id: u64) -> Request {
        self.flow = Some(id);
        self
    }

    /// Only count.
    pub fn count_only(mut self, yes: bool) -> Request {
        self.count_only = yes;
        self
    }

    /// Stops the answer when `cancel` is set.
    pub fn with_cancel(mut self, cancel: Cancel) -> Request {
        self.cancel = Some(cancel);
        self
    }

    /// Whether the request's cancel flag is set (what a [`Remote`](crate::Remote) looks at while it waits).
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(Cancel::is_cancelled)
    }

    /// [`Error::Cancelled`] when the request's cancel flag is set.
    #[inline]
    pub(crate) fn go_on(&self) -> Result<(), Error> {
        if self.is_cancelled() { Err(Error::Cancelled) } else { Ok(()) }
    }

    /// Refuses a request that cannot have an answer.
    pub(crate) fn check(&self) -> Result<(), Error> {
        match (self.after, self.before) {
            (Some(a), Some(b)) if a >= b => Err(Error::EmptyWindow),
            _ => Ok(()),
        }
    }

    /// Whether `ts_ns` is inside the time window.
    #[inline]
    pub(crate) fn in_window(&self, ts_ns: u64) -> bool {
        self.after.is_none_or(|a| ts_ns >= a) && self.before.is_none_or(|b| ts_ns < b)
    }

    pub(crate) fn has_window(&self) -> bool {
        self.after.is_some() || self.before.is_some()
    }

    /// The time window as a condition on packets (`None` without one).
    pub(crate) fn window(&self) -> Option<Need> {
        if !self.has_window() {
            return None;
        }
        let hi = self.before.map_or(u128::from(u64::MAX), |b| u128::from(b.saturating_sub(1)));
        Some(Need::Pred(Pred::range(Field::Time, u128::from(self.after.unwrap_or(0)), hi)))
    }

    /// `need` within the time window.
    pub(crate) fn windowed(&self, need: Need) -> Need {
        match self.window() {
            Some(w) => Need::and(vec![need, w]),
            None => need,
        }
    }
}

/// Told how far an answer has come, for progress bars. Calls may come from several threads.
pub trait Progress: Sync {
    /// The work ahead, in bytes of the source (`None`: unknown).
    fn start(&self, total: Option<u64>) {
        let _ = total;
    }
    /// `bytes` more are done.
    fn advance(&self, bytes: u64) {
        let _ = bytes;
    }
    /// The work is done up to byte `at`.
    fn at(&self, at: u64) {
        let _ = at;
    }
    /// The work is over.
    fn finish(&self) {}
}

/// No progress reports.
impl Progress for () {}

/// What an answer came to.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Outcome {
    /// Matching packets (given to the sink, or counted).
    pub matched: u64,
    /// Packets of the source that were looked at or that the index describes.
    pub packets: u64,
    /// Packets the index selected and the filter ran on (when the index was read).
    pub candidates: Option<u64>,
    /// Matches the index counted without reading them.
    pub counted_from_index: Option<u64>,
    /// Damage that ended a trace; every match before it was given to the sink.
    pub damage: Option<pcaptool_packet::TraceError>,
    /// Damaged segments of a store left out (with `skip_damaged`).
    pub skipped: Vec<pcaptool_flowstore::DamagedSegment>,
    /// What a store read.
    pub store: Option<pcaptool_flowstore::QueryStats>,
    /// Whether the sink stopped the answer before its end.
    pub stopped: bool,
    /// Parts of a merged source left out because they failed (with `partial`): name and why.
    pub failed: Vec<(String, String)>,
}

//! One module per subcommand.

pub(crate) mod convert;
pub(crate) mod explain;
pub(crate) mod info;
pub(crate) mod query;

//! One module per subcommand.

pub(crate) mod convert;
pub(crate) mod info;

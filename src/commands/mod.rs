//! What the binary's commands do, each from a [`Config`](crate::config::Config):
//! `run` streams (and is the library's embedding API), `check` says whether a run
//! would work, `read` reads back what a run wrote, `snapshot` asks a running
//! stream to read tables again.

pub mod check;
pub mod read;
pub mod run;
pub mod snapshot;

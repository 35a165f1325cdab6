//! The crash loop and disk-fault harness of docs/reliability.md (the binary is `sepp-crash`):
//! a FUSE layer that can drop unsynced writes ([`faultfs`]), the mixed load ([`load`]), the
//! checker of the client's view ([`model`]) and the server process under test ([`server`]).

pub mod faultfs;
pub mod load;
pub mod model;
pub mod server;

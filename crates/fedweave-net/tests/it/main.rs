//! End-to-end tests of the network runtime on loopback: the same config
//! gives the same results over gRPC as in simulation.

mod common;
mod decoders;
mod e2e;
mod hostile;
mod hostile_server;
mod p2p;
mod security;

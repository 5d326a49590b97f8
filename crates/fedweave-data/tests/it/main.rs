//! All of this crate's integration tests in one binary: each test binary is a
//! separate link step, and linking dominates CI time and disk.
mod cifar;
mod config;
mod emnist;
mod idx;
mod images;
mod leaf;
mod movielens;
mod paper_partitions;
mod partitions;
mod pfllib;
mod tiny_imagenet;
mod yahoo;

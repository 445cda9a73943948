//! Software RDMA over TCP.

pub mod frame;

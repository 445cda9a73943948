//! Software RDMA over TCP.

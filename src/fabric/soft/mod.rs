//! Software RDMA shared by the loopback and tcp fabrics: the registration table and the reliable-connection semantics.

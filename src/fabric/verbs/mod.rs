//! RDMA NICs through rdma-core (libibverbs + librdmacm).

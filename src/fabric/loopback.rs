//! In-process fabric with fault injection.

//! Wire format of RTRS 2.0 and RNBD 2.x (pure: no I/O).

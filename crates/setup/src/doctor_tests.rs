//! Unit tests of the doctor checks, on values.

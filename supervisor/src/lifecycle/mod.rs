//! Supervisor state machines, one per file (style convention 10): each has
//! a table comment, closed `State`/`Event` enums and a pure `step()`; only
//! the executor in `daemon` acts on the returned actions.

pub mod mount;
pub mod upgrade;

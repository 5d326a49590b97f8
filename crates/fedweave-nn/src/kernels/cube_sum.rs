//! A sum across one cube's units, for the cube backends' kernels that give
//! each channel or client a cube of its own.

use cubecl::prelude::*;

/// Units per cube of those kernels: a power of two ([`cube_sum`] halves it).
pub(crate) const THREADS: u32 = 256;

/// The sum of every unit's `v`, returned to every unit. `shared` holds one
/// value per unit (a fresh slice per sum: units read the total from it
/// after the last meeting); the cube meets after each halving.
#[cube]
pub(crate) fn cube_sum<F: Float>(v: F, shared: &mut Shared<[F]>) -> F {
    shared[UNIT_POS as usize] = v;
    sync_cube();
    let mut active = CUBE_DIM;
    while active > 1 {
        active /= 2;
        if UNIT_POS < active {
            let other = shared[(UNIT_POS + active) as usize];
            shared[UNIT_POS as usize] += other;
        }
        sync_cube();
    }
    shared[0]
}

//! Tensor shapes.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The dimensions of a tensor, outermost first. A scalar has rank 0.
#[derive(Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    /// The rank-0 shape.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The number of elements (1 for a scalar); `usize::MAX` when the
    /// product overflows (no such tensor can exist, and trace-time checks
    /// refuse it rather than wrap around).
    pub fn numel(&self) -> usize {
        if self.0.contains(&0) {
            return 0;
        }
        self.0.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX)
    }

    /// Row-major (C order) strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        contiguous_strides(&self.0)
    }
}

/// Row-major strides of `dims`, in elements.
pub fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Shape {
        Shape(dims)
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Shape {
        Shape(dims.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Shape {
        Shape(dims.to_vec())
    }
}

impl From<&Shape> for Shape {
    fn from(shape: &Shape) -> Shape {
        shape.clone()
    }
}

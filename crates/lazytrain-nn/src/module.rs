//! The `Module` trait: named, ordered parameters.

use lazytrain_core::Tensor;

/// A model component with parameters.
///
/// Parameters are visited in a fixed order with dotted names that map 1:1
/// to Hugging Face checkpoint names. Because [`Tensor`] handles update in
/// place ([`Tensor::assign`]), optimizers and `load_state_dict` change a
/// module's weights without rebuilding it.
pub trait Module {
    /// Call `visit(name, tensor)` for every parameter, in order, with names
    /// prefixed by `prefix` (empty at the root, `"encoder."` below it, ...).
    fn visit_parameters(&self, prefix: &str, visit: &mut dyn FnMut(String, &Tensor));
}

/// Every parameter of `module` as `(dotted name, tensor)`, in order.
pub fn named_parameters(module: &dyn Module) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    module.visit_parameters("", &mut |name, t| out.push((name, t.clone())));
    out
}

/// `prefix` + `name`, the dotted-path join used by every module.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    format!("{prefix}{name}")
}

//! How values print: `__repr__` shows fields the way Python would (`'text'`, `None`, `True`,
//! `datetime.timedelta(seconds=5)`).

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;

/// Python's `repr()` of `value`.
pub(crate) fn repr<'py, T>(py: Python<'py>, value: T) -> String
where
    T: IntoPyObject<'py>,
{
    value
        .into_bound_py_any(py)
        .and_then(|v| v.repr().map(|r| r.to_string()))
        .unwrap_or_else(|_| "?".into())
}

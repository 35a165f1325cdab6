//! Durations and times: `datetime.timedelta` ⇄ [`Duration`], aware `datetime.datetime` ⇄
//! [`SystemTime`].
//!
//! A naive datetime is refused rather than guessed: the same wall-clock time means different
//! instants on machines in different time zones.

use crate::error::Invalid;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDateTime, PyDelta, PyDeltaAccess, PyTzInfo};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MICROS_PER_DAY: i128 = 86_400_000_000;

/// The Python name of `obj`'s type, for error messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Reads the `timedelta` argument `name` as a non-negative duration (microsecond precision).
///
/// # Errors
/// `TypeError` when `obj` is not a `timedelta`; the `invalid` error when it is negative.
pub(crate) fn duration_arg(
    obj: &Bound<'_, PyAny>,
    name: &str,
    invalid: Invalid,
) -> PyResult<Duration> {
    let py = obj.py();
    let delta = obj.cast::<PyDelta>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a datetime.timedelta, not {}",
            type_name(obj)
        ))
    })?;
    let micros = i128::from(delta.get_days()) * MICROS_PER_DAY
        + i128::from(delta.get_seconds()) * 1_000_000
        + i128::from(delta.get_microseconds());
    let micros = u64::try_from(micros).map_err(|_| {
        invalid.err(
            py,
            format!(
                "{name} is negative ({}): it must be 0 or more",
                obj.str().map(|s| s.to_string()).unwrap_or_default()
            ),
        )
    })?;
    Ok(Duration::from_micros(micros))
}

/// Like [`duration_arg`], with `None` for a missing or `None` argument.
pub(crate) fn opt_duration_arg(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    invalid: Invalid,
) -> PyResult<Option<Duration>> {
    match obj {
        Some(o) if !o.is_none() => duration_arg(o, name, invalid).map(Some),
        _ => Ok(None),
    }
}

fn epoch(py: Python<'_>) -> PyResult<&Bound<'_, PyDateTime>> {
    static EPOCH: PyOnceLock<Py<PyDateTime>> = PyOnceLock::new();
    EPOCH
        .get_or_try_init(py, || {
            let utc = PyTzInfo::utc(py)?;
            Ok::<_, PyErr>(PyDateTime::new(py, 1970, 1, 1, 0, 0, 0, 0, Some(&utc))?.unbind())
        })
        .map(|e| e.bind(py))
}

/// Reads the aware `datetime` `name`: `Err` (`TypeError`) when it is not a `datetime`,
/// `Ok(Err(message))` when it is naive or out of range.
pub(crate) fn datetime_value(
    obj: &Bound<'_, PyAny>,
    name: &str,
) -> PyResult<Result<SystemTime, String>> {
    let py = obj.py();
    if !obj.is_instance_of::<PyDateTime>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a datetime.datetime, not {}",
            type_name(obj)
        )));
    }
    if obj.call_method0("utcoffset")?.is_none() {
        return Ok(Err(format!(
            "{name} is a naive datetime: give it a time zone, e.g. datetime.now(timezone.utc)"
        )));
    }
    let since = obj.sub(epoch(py)?)?;
    let since = since.cast::<PyDelta>()?;
    let micros = i128::from(since.get_days()) * MICROS_PER_DAY
        + i128::from(since.get_seconds()) * 1_000_000
        + i128::from(since.get_microseconds());
    let offset = Duration::from_micros(u64::try_from(micros.unsigned_abs()).unwrap_or(u64::MAX));
    let t = if micros >= 0 {
        UNIX_EPOCH.checked_add(offset)
    } else {
        UNIX_EPOCH.checked_sub(offset)
    };
    Ok(t.ok_or_else(|| format!("{name} is out of range")))
}

/// `t` as an aware UTC `datetime` (microsecond precision).
pub(crate) fn datetime_to_py(py: Python<'_>, t: SystemTime) -> PyResult<Bound<'_, PyAny>> {
    let (sign, d) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (1, d),
        Err(e) => (-1, e.duration()),
    };
    let micros = sign * i128::try_from(d.as_micros()).unwrap_or(i128::MAX);
    let days = i32::try_from(micros.div_euclid(MICROS_PER_DAY))?;
    let rest = micros.rem_euclid(MICROS_PER_DAY);
    let seconds = i32::try_from(rest / 1_000_000)?;
    let microseconds = i32::try_from(rest % 1_000_000)?;
    let delta = PyDelta::new(py, days, seconds, microseconds, true)?;
    epoch(py)?.add(delta)
}

/// `t` as an aware UTC `datetime`, or `None`.
pub(crate) fn opt_datetime_to_py(
    py: Python<'_>,
    t: Option<SystemTime>,
) -> PyResult<Option<Bound<'_, PyAny>>> {
    t.map(|t| datetime_to_py(py, t)).transpose()
}

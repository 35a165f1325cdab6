//! Scalars between JavaScript and the core: milliseconds and `Duration`, numbers and `u32`,
//! `Date` and `SystemTime`, custom values and [`sepp_rs::Value`].
//!
//! These only check that a value can be represented (a count is a non-negative integer, a
//! duration is not negative, a `Date` is valid); whether it is allowed (priority 0 to 9, a
//! positive lease) is the core's check. A value that cannot be represented is returned as
//! an `Err` message naming the field, which the caller turns into its operation's sepp error.

use napi::bindgen_prelude::{BigInt, Either4, FromNapiValue, ToNapiValue, TypeName};
use napi::{Env, ValueType, sys};
use napi_derive::napi;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest integer a JavaScript number holds exactly (`Number.MAX_SAFE_INTEGER`).
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// A JavaScript `Date`, as its time value in milliseconds since the Unix epoch (NaN for an
/// invalid Date).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Date(pub f64);

impl From<SystemTime> for Date {
    fn from(t: SystemTime) -> Self {
        let ms = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs_f64() * 1000.0,
            Err(e) => -(e.duration().as_secs_f64() * 1000.0),
        };
        Date(ms)
    }
}

impl Date {
    /// The time, or an error message for an invalid Date (`new Date("nope")`).
    pub fn to_system_time(self, field: &str) -> Result<SystemTime, String> {
        let ms = self.0;
        if !ms.is_finite() {
            return Err(format!("{field} is an invalid Date"));
        }
        let magnitude = Duration::try_from_secs_f64(ms.abs() / 1000.0)
            .map_err(|_| format!("{field} is out of range"))?;
        let t = if ms >= 0.0 {
            UNIX_EPOCH.checked_add(magnitude)
        } else {
            UNIX_EPOCH.checked_sub(magnitude)
        };
        t.ok_or_else(|| format!("{field} is out of range"))
    }
}

impl TypeName for Date {
    fn type_name() -> &'static str {
        "Date"
    }

    fn value_type() -> ValueType {
        ValueType::Object
    }
}

impl ToNapiValue for Date {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        let env = Env::from_raw(env);
        let date = env.create_date(val.0)?;
        Ok(napi::JsValue::raw(&date))
    }
}

impl FromNapiValue for Date {
    unsafe fn from_napi_value(env: sys::napi_env, value: sys::napi_value) -> napi::Result<Self> {
        let mut is_date = false;
        // SAFETY: the caller passes a live `env` and a value of it.
        napi::check_status!(unsafe { sys::napi_is_date(env, value, &mut is_date) })?;
        if !is_date {
            return Err(napi::Error::new(
                napi::Status::DateExpected,
                "expected a Date",
            ));
        }
        let mut ms = 0.0;
        // SAFETY: as above; `value` is a Date.
        napi::check_status!(unsafe { sys::napi_get_date_value(env, value, &mut ms) })?;
        Ok(Date(ms))
    }
}

/// `n` as JavaScript prints it (`NaN`, `Infinity`, `1e+300`), for messages.
pub fn show(n: f64) -> String {
    if n.is_nan() {
        "NaN".into()
    } else if n.is_infinite() {
        if n > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else if n != 0.0 && !(1e-6..1e21).contains(&n.abs()) {
        let e = format!("{n:e}");
        match e.split_once('e') {
            Some((m, x)) if !x.starts_with('-') => format!("{m}e+{x}"),
            _ => e,
        }
    } else {
        n.to_string()
    }
}

/// `ms` milliseconds as a `Duration`; an error message for a negative, NaN or infinite value.
pub fn duration(field: &str, ms: f64) -> Result<Duration, String> {
    if !ms.is_finite() || ms < 0.0 {
        return Err(format!(
            "{field} is {}: expected a finite, non-negative number of milliseconds",
            show(ms)
        ));
    }
    Duration::try_from_secs_f64(ms / 1000.0)
        .map_err(|_| format!("{field} is {}: out of range", show(ms)))
}

/// A `Duration` in milliseconds (fractions kept).
pub fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `n` as a `u32`; an error message when it is not an integer from 0 to 4294967295.
pub fn uint32(field: &str, n: f64) -> Result<u32, String> {
    if n.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&n) {
        return Err(format!(
            "{field} is {}: expected an integer from 0 to {}",
            show(n),
            u32::MAX
        ));
    }
    Ok(n as u32)
}

/// A value of a job's custom map as JavaScript holds it. On input a `number` that is a safe
/// integer becomes an int64 and any other `number` a double; a `bigint` must fit in int64. On
/// output an int64 within ±(2^53 − 1) is a `number`, a larger one a `bigint`.
#[napi(transparent)]
pub struct CustomValue(pub Either4<String, f64, BigInt, bool>);

/// `v` as a core custom value; an error message for a `bigint` outside int64.
pub fn custom_to_core(field: &str, v: CustomValue) -> Result<sepp_rs::Value, String> {
    Ok(match v.0 {
        Either4::A(s) => sepp_rs::Value::String(s),
        Either4::B(n) => {
            if n.fract() == 0.0 && n.abs() <= MAX_SAFE_INTEGER as f64 {
                sepp_rs::Value::Int(n as i64)
            } else {
                sepp_rs::Value::Double(n)
            }
        }
        Either4::C(b) => sepp_rs::Value::Int(
            bigint_to_i64(&b)
                .ok_or_else(|| format!("{field} is outside the signed 64-bit integer range"))?,
        ),
        Either4::D(b) => sepp_rs::Value::Bool(b),
    })
}

/// A core custom value as JavaScript gets it.
pub fn custom_from_core(v: sepp_rs::Value) -> CustomValue {
    CustomValue(match v {
        sepp_rs::Value::String(s) => Either4::A(s),
        sepp_rs::Value::Double(d) => Either4::B(d),
        sepp_rs::Value::Int(i) if i.unsigned_abs() <= MAX_SAFE_INTEGER => Either4::B(i as f64),
        sepp_rs::Value::Int(i) => Either4::C(BigInt::from(i)),
        sepp_rs::Value::Bool(b) => Either4::D(b),
    })
}

fn bigint_to_i64(b: &BigInt) -> Option<i64> {
    let (low, high) = match b.words.split_first() {
        Some((low, high)) => (*low, high),
        None => return Some(0),
    };
    if high.iter().any(|w| *w != 0) {
        return None;
    }
    let magnitude = i128::from(low);
    i64::try_from(if b.sign_bit { -magnitude } else { magnitude }).ok()
}

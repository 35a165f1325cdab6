//! Reading untyped JavaScript arguments.
//!
//! Every method takes its arguments as `unknown` and reads them here, so that a missing or
//! mistyped field becomes a `TypeError` naming it (`request.jobType must be a string, got
//! number`) delivered as a rejected Promise, instead of a synchronous throw with a generic
//! conversion message. `undefined` and `null` both mean "not given".

use crate::error::Failure;
use crate::value::{CustomValue, Date};
use napi::ValueType;
use napi::bindgen_prelude::{
    BigInt, Either4, FromNapiValue, JsObjectValue, JsValue, Object, Uint8Array, Unknown,
};
use std::collections::HashMap;

/// An argument that cannot be used.
#[derive(Debug)]
pub enum BadInput {
    /// Missing, or of the wrong type: becomes a `TypeError`.
    Type(String),
    /// Of the right type, but a value the core cannot represent (a negative duration, an
    /// invalid `Date`): becomes the operation's sepp error.
    Value(String),
}

impl BadInput {
    /// The failure to report: a `TypeError`, or for a bad value the operation's own error,
    /// made by `invalid` from the message.
    pub fn into_failure<E: Into<Failure>>(self, invalid: impl FnOnce(String) -> E) -> Failure {
        match self {
            BadInput::Type(m) => Failure::Type(m),
            BadInput::Value(m) => invalid(m).into(),
        }
    }
}

impl From<napi::Error> for BadInput {
    fn from(e: napi::Error) -> Self {
        // A failing N-API call while reading (a throwing getter, a revoked Proxy).
        BadInput::Type(e.reason)
    }
}

/// What `value` is, for messages: `number`, `null`, `an array`, ...
fn describe(value: &Unknown<'_>) -> &'static str {
    match value.get_type() {
        Ok(ValueType::Undefined) => "undefined",
        Ok(ValueType::Null) => "null",
        Ok(ValueType::Boolean) => "boolean",
        Ok(ValueType::Number) => "number",
        Ok(ValueType::String) => "string",
        Ok(ValueType::Symbol) => "symbol",
        Ok(ValueType::BigInt) => "bigint",
        Ok(ValueType::Function) => "function",
        Ok(ValueType::External) => "external",
        Ok(ValueType::Object) if value.is_array().unwrap_or(false) => "an array",
        Ok(ValueType::Object) if value.is_date().unwrap_or(false) => "a Date",
        Ok(ValueType::Object) if value.is_typedarray().unwrap_or(false) => "a typed array",
        Ok(ValueType::Object) => "an object",
        _ => "an unknown value",
    }
}

fn mistyped(path: &str, expected: &str, value: &Unknown<'_>) -> BadInput {
    BadInput::Type(format!(
        "{path} must be {expected}, got {}",
        describe(value)
    ))
}

/// `value`, unless it is `undefined` or `null`.
fn given<'env>(value: Option<Unknown<'env>>) -> Result<Option<Unknown<'env>>, BadInput> {
    match value {
        None => Ok(None),
        Some(v) => match v.get_type()? {
            ValueType::Undefined | ValueType::Null => Ok(None),
            _ => Ok(Some(v)),
        },
    }
}

fn required<'env>(
    value: Option<Unknown<'env>>,
    path: &str,
    expected: &str,
) -> Result<Unknown<'env>, BadInput> {
    given(value)?.ok_or_else(|| BadInput::Type(format!("{path} is missing: expected {expected}")))
}

/// A required string argument.
pub fn string(value: Option<Unknown<'_>>, path: &str) -> Result<String, BadInput> {
    as_string(required(value, path, "a string")?, path)
}

/// A required number argument.
pub fn number(value: Option<Unknown<'_>>, path: &str) -> Result<f64, BadInput> {
    as_number(required(value, path, "a number")?, path)
}

fn as_string(v: Unknown<'_>, path: &str) -> Result<String, BadInput> {
    if v.get_type()? != ValueType::String {
        return Err(mistyped(path, "a string", &v));
    }
    Ok(String::from_unknown(v)?)
}

fn as_number(v: Unknown<'_>, path: &str) -> Result<f64, BadInput> {
    if v.get_type()? != ValueType::Number {
        return Err(mistyped(path, "a number", &v));
    }
    Ok(f64::from_unknown(v)?)
}

/// The fields of an options or request object, read one by one with their path for messages.
pub struct Fields<'env> {
    obj: Object<'env>,
    path: String,
}

impl<'env> Fields<'env> {
    /// A required object argument.
    pub fn required(value: Option<Unknown<'env>>, path: &str) -> Result<Self, BadInput> {
        let v = required(value, path, "an object")?;
        Self::of(v, path)
    }

    /// An optional object argument: `None` for `undefined` or `null`.
    pub fn optional(value: Option<Unknown<'env>>, path: &str) -> Result<Option<Self>, BadInput> {
        given(value)?.map(|v| Self::of(v, path)).transpose()
    }

    fn of(v: Unknown<'env>, path: &str) -> Result<Self, BadInput> {
        if v.get_type()? != ValueType::Object || v.is_array()? {
            return Err(mistyped(path, "an object", &v));
        }
        Ok(Fields {
            obj: Object::from_unknown(v)?,
            path: path.to_string(),
        })
    }

    /// The path of field `name`, e.g. `request.payload.data`.
    pub fn path(&self, name: &str) -> String {
        format!("{}.{name}", self.path)
    }

    /// The raw value of `name`, `None` when `undefined` or `null`.
    pub fn get(&self, name: &str) -> Result<Option<Unknown<'env>>, BadInput> {
        given(Some(self.obj.get_named_property::<Unknown<'env>>(name)?))
    }

    /// Whether `name` is explicitly `null` (as opposed to missing or `undefined`).
    pub fn is_null(&self, name: &str) -> Result<bool, BadInput> {
        let v = self.obj.get_named_property::<Unknown<'env>>(name)?;
        Ok(v.get_type()? == ValueType::Null)
    }

    fn require(&self, name: &str, expected: &str) -> Result<Unknown<'env>, BadInput> {
        self.get(name)?.ok_or_else(|| {
            BadInput::Type(format!(
                "{} is missing: expected {expected}",
                self.path(name)
            ))
        })
    }

    /// An optional string.
    pub fn string(&self, name: &str) -> Result<Option<String>, BadInput> {
        self.get(name)?
            .map(|v| as_string(v, &self.path(name)))
            .transpose()
    }

    /// A required string.
    pub fn required_string(&self, name: &str) -> Result<String, BadInput> {
        as_string(self.require(name, "a string")?, &self.path(name))
    }

    /// An optional number.
    pub fn number(&self, name: &str) -> Result<Option<f64>, BadInput> {
        self.get(name)?
            .map(|v| as_number(v, &self.path(name)))
            .transpose()
    }

    /// A required number.
    pub fn required_number(&self, name: &str) -> Result<f64, BadInput> {
        as_number(self.require(name, "a number")?, &self.path(name))
    }

    /// An optional boolean.
    pub fn boolean(&self, name: &str) -> Result<Option<bool>, BadInput> {
        let path = self.path(name);
        match self.get(name)? {
            None => Ok(None),
            Some(v) if v.get_type()? == ValueType::Boolean => Ok(Some(bool::from_unknown(v)?)),
            Some(v) => Err(mistyped(&path, "a boolean", &v)),
        }
    }

    /// An optional `Date`.
    pub fn date(&self, name: &str) -> Result<Option<Date>, BadInput> {
        match self.get(name)? {
            None => Ok(None),
            Some(v) if v.is_date()? => Ok(Some(Date::from_unknown(v)?)),
            Some(v) => Err(mistyped(&self.path(name), "a Date", &v)),
        }
    }

    /// Required bytes: a `Uint8Array` (a `Buffer` is one).
    pub fn required_bytes(&self, name: &str) -> Result<Uint8Array, BadInput> {
        let path = self.path(name);
        let v = self.require(name, "a Uint8Array")?;
        if !v.is_typedarray()? {
            return Err(mistyped(&path, "a Uint8Array", &v));
        }
        // Another typed array (Int16Array, ...) fails here.
        Uint8Array::from_unknown(v).map_err(|_| mistyped(&path, "a Uint8Array", &v))
    }

    /// Bytes given as a string (UTF-8) or a `Uint8Array`.
    pub fn text_or_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, BadInput> {
        let path = self.path(name);
        match self.get(name)? {
            None => Ok(None),
            Some(v) if v.get_type()? == ValueType::String => {
                Ok(Some(as_string(v, &path)?.into_bytes()))
            }
            Some(v) if v.is_typedarray()? => Uint8Array::from_unknown(v)
                .map(|a| Some(a.to_vec()))
                .map_err(|_| mistyped(&path, "a string or a Uint8Array", &v)),
            Some(v) => Err(mistyped(&path, "a string or a Uint8Array", &v)),
        }
    }

    /// An optional nested object.
    pub fn object(&self, name: &str) -> Result<Option<Fields<'env>>, BadInput> {
        Fields::optional(self.get(name)?, &self.path(name))
    }

    /// A required array of strings.
    pub fn required_strings(&self, name: &str) -> Result<Vec<String>, BadInput> {
        let path = self.path(name);
        let v = self.require(name, "an array of strings")?;
        if !v.is_array()? {
            return Err(mistyped(&path, "an array of strings", &v));
        }
        let array = Object::from_unknown(v)?;
        (0..array.get_array_length()?)
            .map(|i| {
                let item = array.get_element::<Unknown<'env>>(i)?;
                as_string(item, &format!("{path}[{i}]"))
            })
            .collect()
    }

    /// An optional record of custom values (`string | number | bigint | boolean`).
    pub fn custom(&self, name: &str) -> Result<Option<HashMap<String, CustomValue>>, BadInput> {
        let Some(record) = self.object(name)? else {
            return Ok(None);
        };
        let mut out = HashMap::new();
        for key in Object::keys(&record.obj)? {
            let path = record.path(&key);
            let v = record.obj.get_named_property::<Unknown<'env>>(&key)?;
            let value = CustomValue(match v.get_type()? {
                ValueType::String => Either4::A(String::from_unknown(v)?),
                ValueType::Number => Either4::B(f64::from_unknown(v)?),
                ValueType::BigInt => Either4::C(BigInt::from_unknown(v)?),
                ValueType::Boolean => Either4::D(bool::from_unknown(v)?),
                _ => {
                    return Err(mistyped(&path, "a string, number, bigint or boolean", &v));
                }
            });
            out.insert(key, value);
        }
        Ok(Some(out))
    }
}

/// An optional list of request objects, each read by `read` with its index in the path.
pub fn array<'env, T>(
    value: Option<Unknown<'env>>,
    path: &str,
    mut read: impl FnMut(Unknown<'env>, &str) -> Result<T, BadInput>,
) -> Result<Vec<T>, BadInput> {
    let v = required(value, path, "an array")?;
    if !v.is_array()? {
        return Err(mistyped(path, "an array", &v));
    }
    let array = Object::from_unknown(v)?;
    (0..array.get_array_length()?)
        .map(|i| {
            read(
                array.get_element::<Unknown<'env>>(i)?,
                &format!("{path}[{i}]"),
            )
        })
        .collect()
}

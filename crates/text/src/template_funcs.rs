//! The Python-flavoured helpers Hugging Face gives chat templates, re-done for minijinja:
//! `tojson` with Python `json.dumps` formatting and `strftime_now`.
//!
//! minijinja's own `tojson` escapes `<`, `>`, `&` and `'` for HTML and writes compact JSON;
//! Hugging Face's is `json.dumps(x, ensure_ascii=False)`, which writes `{"a": 1, "b": [1, 2]}`.
//! Templates that print tool schemas with it must produce the same bytes the model was trained
//! on, so this module formats JSON the Python way.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// `tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, i.e.
/// Python's `json.dumps` with Hugging Face's defaults.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let invalid = |msg: &str| Error::new(ErrorKind::InvalidOperation, format!("tojson: {msg}"));
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            None => Some(
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| invalid("indent must be an integer or a string"))?,
            ),
        },
    };
    // Python's defaults: ", " between items, or "," when indenting (newlines separate them).
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap_or_default().to_owned(), b.as_str().unwrap_or_default().to_owned())
                }
                _ => return Err(invalid("separators must be two strings")),
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let fmt = JsonFormat {
        indent: indent.as_deref(),
        item_sep: &item_sep,
        key_sep: &key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    fmt.write(&mut out, value, 0)?;
    // Marked safe so that an auto-escaping environment does not escape it a second time.
    Ok(Value::from_safe_string(out))
}

struct JsonFormat<'a> {
    indent: Option<&'a str>,
    item_sep: &'a str,
    key_sep: &'a str,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonFormat<'_> {
    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if value.is_integer() {
                    write!(out, "{value}").map_err(fmt_error)?;
                } else {
                    let v = f64::try_from(value.clone())?;
                    out.push_str(&python_float(v));
                }
            }
            ValueKind::String => self.write_string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(out, '[', ']', &items, depth, |out, item, depth| {
                    self.write(out, item, depth)
                })?;
            }
            ValueKind::Map => {
                let mut entries: Vec<(Value, Value)> = value
                    .try_iter()?
                    .map(|k| {
                        let v = value.get_item(&k)?;
                        Ok((k, v))
                    })
                    .collect::<Result<_, Error>>()?;
                if self.sort_keys {
                    entries.sort_by_key(|(k, _)| k.to_string());
                }
                self.write_container(out, '{', '}', &entries, depth, |out, (k, v), depth| {
                    // JSON keys are strings; Python converts numbers and booleans the same way.
                    match k.as_str() {
                        Some(s) => self.write_string(out, s),
                        None => self.write_string(out, &k.to_string()),
                    }
                    out.push_str(self.key_sep);
                    self.write(out, v, depth)
                })?;
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: cannot serialize a {kind} value"),
                ));
            }
        }
        Ok(())
    }

    /// Writes `items` between `open` and `close`: separated by `item_sep`, and each on its own
    /// indented line when `indent` is set.
    fn write_container<T>(
        &self,
        out: &mut String,
        open: char,
        close: char,
        items: &[T],
        depth: usize,
        mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(self.item_sep);
            }
            if let Some(indent) = self.indent {
                out.push('\n');
                out.push_str(&indent.repeat(depth + 1));
            }
            write_item(out, item, depth + 1)?;
        }
        if let Some(indent) = self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
        out.push(close);
        Ok(())
    }

    /// A JSON string literal as Python writes it; with `ensure_ascii`, non-ASCII characters
    /// become `\uXXXX` escapes (surrogate pairs above U+FFFF).
    fn write_string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0C}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A float as Python's `repr` writes it: shortest round-trip digits, `1.0` rather than `1`,
/// exponent notation outside `1e-4 <= |v| < 1e16`, and `NaN` / `Infinity` as `json.dumps` does.
fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let plain = format!("{v}");
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

fn fmt_error(_: std::fmt::Error) -> Error {
    Error::new(ErrorKind::InvalidOperation, "tojson: formatting failed")
}

/// `strftime_now(format)`: the current time (UTC) formatted with C `strftime` directives.
pub(crate) fn strftime_now(format: &str) -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    strftime(format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Formats `secs` since the Unix epoch (UTC). Supports `%Y %y %m %d %e %B %b %h %A %a %H %I %M
/// %S %p %j %F %T %D %%`; other directives are written as they are.
pub(crate) fn strftime(format: &str, secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = ((days + 3) % 7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let weekday_name = WEEKDAYS[weekday];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match d {
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year % 100),
            'm' => write!(out, "{month:02}"),
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:>2}"),
            'B' => write!(out, "{month_name}"),
            'b' | 'h' => write!(out, "{}", &month_name[..3]),
            'A' => write!(out, "{weekday_name}"),
            'a' => write!(out, "{}", &weekday_name[..3]),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{hour12:02}"),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'j' => write!(out, "{day_of_year:03}"),
            'F' => write!(out, "{year}-{month:02}-{day:02}"),
            'T' => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            'D' => write!(out, "{month:02}/{day:02}/{:02}", year % 100),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

/// `(year, month 1..=12, day 1..=31)` of the day `days` after 1970-01-01 (proleptic Gregorian).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shift the epoch to 0000-03-01 so leap days fall at the end of each 400-year era's years.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Days from 1970-01-01 to the given date (the inverse of [`civil_from_days`]).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y % 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_with(v: serde_json::Value, kwargs: &[(&str, Value)]) -> String {
        let kwargs = Kwargs::from_iter(kwargs.iter().cloned());
        tojson(&Value::from_serialize(v), kwargs).unwrap().to_string()
    }

    fn json(v: serde_json::Value, indent: Option<i64>) -> String {
        match indent {
            Some(n) => json_with(v, &[("indent", Value::from(n))]),
            None => json_with(v, &[]),
        }
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        // Keys in sorted order: serde_json's map (without `preserve_order`) sorts them.
        let v =
            serde_json::json!({"args": [1, 2.5, true, null], "name": "get_weather", "s": "<a & 'b'>\n\"é\""});
        // Python: json.dumps(v, ensure_ascii=False)
        assert_eq!(
            json(v, None),
            r#"{"args": [1, 2.5, true, null], "name": "get_weather", "s": "<a & 'b'>\n\"é\""}"#
        );
        assert_eq!(
            json(serde_json::json!({"a": [1, {}], "b": []}), Some(2)),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"
        );
        assert_eq!(json(serde_json::json!("\u{1}"), None), r#""\u0001""#);
    }

    #[test]
    fn tojson_options() {
        let v = serde_json::json!({"b": "é😀", "a": [1, 2]});
        // Python: json.dumps(v, ensure_ascii=True, sort_keys=True)
        assert_eq!(
            json_with(v.clone(), &[("ensure_ascii", Value::from(true)), ("sort_keys", Value::from(true))]),
            r#"{"a": [1, 2], "b": "\u00e9\ud83d\ude00"}"#
        );
        // Python: json.dumps(v, separators=(",", ":"), ensure_ascii=False). Keys in written order:
        // serde_json keeps that order or sorts, depending on its features in the build, so the
        // keys here are already sorted.
        let v = serde_json::json!({"a": [1, 2], "b": "é😀"});
        assert_eq!(json_with(v, &[("separators", Value::from(vec![",", ":"]))]), r#"{"a":[1,2],"b":"é😀"}"#);
        let err = tojson(&Value::from(1), Kwargs::from_iter([("separators", Value::from(3))]));
        assert!(err.is_err());
    }

    #[test]
    fn floats_print_like_python() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.1), "0.1");
        assert_eq!(python_float(-2.5), "-2.5");
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(1.5e-5), "1.5e-05");
        assert_eq!(python_float(123456789.0), "123456789.0");
        assert_eq!(python_float(f64::NAN), "NaN");
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday; day 208 of a leap year.
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(strftime("%A %B %e, %y", t), "Friday July 26, 24");
        assert_eq!(strftime("%F %T %I%p %j %a %%", t), "2024-07-26 13:05:09 01PM 208 Fri %");
        assert_eq!(strftime("%Q", t), "%Q");
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        // Leap day and the turn of a century.
        assert_eq!(strftime("%Y-%m-%d %A", 951_782_400), "2000-02-29 Tuesday");
        assert_eq!(strftime("%Y-%m-%d", 4_102_444_800), "2100-01-01");
    }
}

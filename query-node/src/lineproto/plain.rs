//! The parser for plain lines: no escapes and none of the forms that need
//! the general grammar, which is what writers send almost always.
//!
//! It recognizes a strict subset of line protocol and gives up (returns
//! `None`) on anything else, so the general parser (the
//! `influxdb-line-protocol` crate) answers every line this one does not,
//! rejections and their messages included. Where it answers, it answers as
//! the crate would: the tests parse random lines both ways and compare.
//!
//! The subset: names (measurement, tag keys and values, field keys) made of
//! printable ASCII other than `,`, `=`, `"` and `\` (and not starting
//! with `#`, which makes the line a comment); one space before the
//! fields and one before the timestamp; nothing after the timestamp; field
//! values as integers (`-12i`), unsigned integers (`12u`), floats
//! (`-1.5e3`, `12`), booleans, and strings with no backslash.

use influxdb_line_protocol::EscapedStr;

use super::Value;

/// One line's parts, as either parser gives them.
#[derive(Debug, PartialEq)]
pub(super) struct Line<'a> {
    pub measurement: EscapedStr<'a>,
    /// In the order the line lists them.
    pub tags: Vec<(EscapedStr<'a>, EscapedStr<'a>)>,
    pub fields: Vec<(EscapedStr<'a>, Value<'a>)>,
    pub timestamp: Option<i64>,
}

/// Whether `b` may appear in a plain name.
fn name_byte(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) && !matches!(b, b',' | b'=' | b'"' | b'\\')
}

/// The end of the plain name that starts at `from`.
fn name_end(b: &[u8], from: usize) -> usize {
    from + b[from..].iter().take_while(|&&c| name_byte(c)).count()
}

/// A nonempty name from `from`, followed by `=`; returns its end.
fn key_end(b: &[u8], from: usize) -> Option<usize> {
    let end = name_end(b, from);
    (end > from && b.get(end) == Some(&b'=')).then_some(end)
}

/// Whether `s` is an optional minus sign and one or more digits.
fn signed_digits(s: &[u8]) -> bool {
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}

/// Whether `s` is a float as the grammar spells one:
/// `-?D(.D)?([eE][+-]?D)?` with D one or more digits.
fn float_text(s: &[u8]) -> bool {
    let digits = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut s = s.strip_prefix(b"-").unwrap_or(s);
    let n = digits(s);
    if n == 0 {
        return false;
    }
    s = &s[n..];
    if let Some(rest) = s.strip_prefix(b".") {
        let n = digits(rest);
        if n == 0 {
            return false;
        }
        s = &rest[n..];
    }
    if let Some((&(b'e' | b'E'), rest)) = s.split_first() {
        let rest = match rest.first() {
            Some(b'+' | b'-') => &rest[1..],
            _ => rest,
        };
        let n = digits(rest);
        if n == 0 {
            return false;
        }
        s = &rest[n..];
    }
    s.is_empty()
}

/// A field value other than a string, from its whole text.
fn scalar(text: &str) -> Option<Value<'_>> {
    let b = text.as_bytes();
    match b.last()? {
        b'i' => {
            let t = &text[..text.len() - 1];
            signed_digits(t.as_bytes()).then(|| t.parse().ok().map(Value::I64))?
        }
        b'u' => {
            let t = &text[..text.len() - 1];
            (!t.is_empty() && t.bytes().all(|c| c.is_ascii_digit()))
                .then(|| t.parse().ok().map(Value::U64))?
        }
        _ if float_text(b) => text.parse().ok().map(Value::F64),
        _ => match text {
            "t" | "T" | "true" | "True" | "TRUE" => Some(Value::Bool(true)),
            "f" | "F" | "false" | "False" | "FALSE" => Some(Value::Bool(false)),
            _ => None,
        },
    }
}

/// Parses `line` if it is plain; `None` leaves it to the general parser.
/// `tags` and `fields` are capacities to start with (the previous line's
/// counts, say).
pub(super) fn parse(line: &str, tags: usize, fields: usize) -> Option<Line<'_>> {
    let b = line.as_bytes();
    let mut i = name_end(b, 0);
    // A line that starts with `#` is a comment.
    if i == 0 || b[0] == b'#' {
        return None;
    }
    let measurement = EscapedStr::from(&line[..i]);
    let mut tag_list = Vec::with_capacity(tags);
    while b.get(i) == Some(&b',') {
        let key = i + 1;
        let eq = key_end(b, key)?;
        let end = name_end(b, eq + 1);
        if end == eq + 1 {
            return None;
        }
        tag_list.push((line[key..eq].into(), line[eq + 1..end].into()));
        i = end;
    }
    if b.get(i) != Some(&b' ') {
        return None;
    }
    i += 1;
    let mut field_list = Vec::with_capacity(fields);
    loop {
        let eq = key_end(b, i)?;
        let start = eq + 1;
        let (value, end) = if b.get(start) == Some(&b'"') {
            let len = b[start + 1..].iter().position(|&c| c == b'"')?;
            let text = &line[start + 1..start + 1 + len];
            if text.contains('\\') {
                return None;
            }
            (Value::Str(text.into()), start + len + 2)
        } else {
            let end = start
                + b[start..]
                    .iter()
                    .take_while(|&&c| c != b',' && c != b' ')
                    .count();
            (scalar(&line[start..end])?, end)
        };
        field_list.push((line[i..eq].into(), value));
        i = end;
        match b.get(i) {
            Some(b',') => i += 1,
            _ => break,
        }
    }
    let timestamp = match b.get(i) {
        None => None,
        Some(b' ') if signed_digits(&b[i + 1..]) => Some(line[i + 1..].parse().ok()?),
        Some(_) => return None,
    };
    Some(Line {
        measurement,
        tags: tag_list,
        fields: field_list,
        timestamp,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Precision, parse_body_with, parse_general};
    use super::*;
    use proptest::prelude::*;

    /// A name as plain lines spell them.
    fn name() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9_.:/-][a-zA-Z0-9_.:/#-]{0,5}"
    }

    /// A field value's text, of every type and some that are none.
    fn value_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|v| format!("{v}i")),
            any::<u64>().prop_map(|v| format!("{v}u")),
            any::<f64>()
                .prop_filter("finite", |v| v.is_finite())
                .prop_map(|v| format!("{v}")),
            any::<f64>()
                .prop_filter("finite", |v| v.is_finite())
                .prop_map(|v| format!("{v:e}")),
            "-?[0-9]{1,3}(\\.[0-9]{0,3})?([eE][+-]?[0-9]{0,3})?[iu]?",
            "[0-9]{19,21}[iu]",
            prop::sample::select(vec![
                "t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE", "tru",
                "yes",
            ])
            .prop_map(str::to_string),
            "[a-z ,=]{0,5}".prop_map(|s| format!("\"{s}\"")),
        ]
    }

    /// A line made only of plain parts.
    fn plain_line() -> impl Strategy<Value = String> {
        (
            name(),
            prop::collection::vec((name(), name()), 0..4),
            prop::collection::vec((name(), value_text()), 1..4),
            prop::option::of(prop_oneof![
                any::<i64>().prop_map(|t| t.to_string()),
                "[+-]?[0-9]{1,20}",
            ]),
        )
            .prop_map(|(m, tags, fields, ts)| {
                let mut line = m;
                for (k, v) in tags {
                    line.push_str(&format!(",{k}={v}"));
                }
                let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                line.push(' ');
                line.push_str(&fields.join(","));
                if let Some(ts) = ts {
                    line.push_str(&format!(" {ts}"));
                }
                line
            })
    }

    /// A line with characters that matter to the grammar put in at random
    /// places, or a run of such characters alone.
    fn any_line() -> impl Strategy<Value = String> {
        let special = prop::sample::select(vec![
            ',', '=', '"', '\\', ' ', ' ', '\t', '\r', '\n', '#', '.', 'e', '-', '+', 'i', 'u',
            '0', 'é', '\0',
        ]);
        prop_oneof![
            plain_line(),
            (
                plain_line(),
                prop::collection::vec((any::<prop::sample::Index>(), special.clone()), 1..4)
            )
                .prop_map(|(line, edits)| {
                    let mut chars: Vec<char> = line.chars().collect();
                    for (at, c) in edits {
                        chars.insert(at.index(chars.len() + 1), c);
                    }
                    chars.into_iter().collect()
                }),
            prop::collection::vec(prop_oneof![special, prop::char::range('a', 'c')], 0..24)
                .prop_map(|c| c.into_iter().collect()),
        ]
    }

    #[test]
    fn plain_lines_of_every_value_type_parse() {
        let line =
            "cpu,host=h-1,dc=eu:1 a=-3i,b=4u,c=-1.5e-3,d=2,e=t,f=FALSE,g=\"x, y=z\",h=\"\" -17";
        let got = parse(line, 0, 0).expect("plain");
        assert_eq!(got, parse_general(line).unwrap().unwrap());
        assert_eq!(got.fields.len(), 8);
        assert_eq!(got.fields[6].1, Value::Str("x, y=z".into()));
        assert_eq!(got.timestamp, Some(-17));
        // Escapes, quotes in names, two spaces, trailing text: not plain.
        for line in [
            "cpu,host=a\\ b v=1 1",
            "cpu v=\"a\\\"b\" 1",
            "cpu  v=1 1",
            "cpu v=1 1 ",
            "cpu v=1 1\r",
            " cpu v=1",
            "cpu v=1.",
            "cpu v=1 +5",
            "cpu v=1 99999999999999999999",
            "cpu v=99999999999999999999i",
            "c\"pu v=1",
        ] {
            assert_eq!(parse(line, 0, 0), None, "{line}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn a_line_parsed_plain_is_parsed_as_the_general_parser_does(line in any_line()) {
            if let Some(plain) = parse(&line, 2, 2) {
                match parse_general(&line) {
                    Some(Ok(general)) => prop_assert_eq!(plain, general),
                    other => prop_assert!(false, "general parser: {:?}", other),
                }
            }
        }

        #[test]
        fn lines_of_plain_parts_take_the_plain_path(line in plain_line()) {
            // Every value text the generator makes that the general parser
            // takes, the plain parser takes too (overlong integers and
            // words that are not booleans are refused by both).
            let general = parse_general(&line).unwrap();
            prop_assert_eq!(parse(&line, 0, 0).is_some(), general.is_ok(), "{:?}", general);
        }

        #[test]
        fn a_body_parses_the_same_with_or_without_the_plain_path(
            lines in prop::collection::vec(
                prop_oneof![
                    8 => any_line(),
                    1 => Just(String::new()),
                    1 => Just("# comment".to_string()),
                ],
                0..12,
            ),
            precision in prop::sample::select(vec![Precision::Ns, Precision::S]),
        ) {
            let body = lines.join("\n");
            let summary = |try_plain: bool| {
                let mut rejected = Vec::new();
                let tables = parse_body_with(&body, precision, 7, &mut rejected, try_plain);
                let rows: Vec<_> = tables
                    .into_iter()
                    .flat_map(|(table, rows)| {
                        rows.into_iter().map(move |r| {
                            (table.clone(), r.line, r.tags, r.fields, r.time_ns)
                        })
                    })
                    .collect();
                (format!("{rows:?}"), rejected)
            };
            prop_assert_eq!(summary(true), summary(false));
        }
    }
}

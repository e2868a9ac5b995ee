//! A file's YAML front matter, read with every node's line (saphyr), into
//! a small tree the agent formats map field by field.

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use serde_json::Value;

/// A YAML node and the line of the file it starts on.
#[derive(Clone, Debug)]
pub(super) struct Node {
    /// The line in the whole file (1-based).
    pub line: usize,
    /// Where it is in the parsed text, in characters (a quoted scalar's
    /// quotes included): what a secret's redaction replaces.
    pub chars: std::ops::Range<usize>,
    /// What it holds.
    pub kind: Kind,
}

/// A node's value. Mapping keys are text (a number or a boolean key is
/// read as its text).
#[derive(Clone, Debug)]
pub(super) enum Kind {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// The entries in file order, each key with its line.
    Map(Vec<(String, usize, Node)>),
}

impl Node {
    /// The text of a string scalar.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Kind::Str(s) => Some(s),
            _ => None,
        }
    }

    /// What it is, for a message (`a string`, `a list`, …).
    pub fn what(&self) -> &'static str {
        match self.kind {
            Kind::Null => "empty",
            Kind::Bool(_) => "a boolean",
            Kind::Int(_) => "an integer",
            Kind::Float(_) => "a number",
            Kind::Str(_) => "a string",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }

    /// The node as JSON (what serde-read sections take).
    pub fn to_json(&self) -> Value {
        match &self.kind {
            Kind::Null => Value::Null,
            Kind::Bool(b) => Value::Bool(*b),
            Kind::Int(i) => Value::from(*i),
            Kind::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Kind::Str(s) => Value::String(s.clone()),
            Kind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            Kind::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, _, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The line of the node at `path` below this one (mapping keys and
    /// list indices, as a serde error names them), else of the deepest
    /// node on the way.
    pub fn line_at(&self, path: &[String]) -> usize {
        let mut node = self;
        let mut line = self.line;
        for segment in path {
            let next = match &node.kind {
                Kind::Map(entries) => entries
                    .iter()
                    .find(|(k, _, _)| k == segment)
                    .map(|(_, l, v)| (*l, v)),
                Kind::Seq(items) => segment
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get(i))
                    .map(|v| (v.line, v)),
                _ => None,
            };
            match next {
                Some((l, v)) => {
                    line = l;
                    node = v;
                }
                None => break,
            }
        }
        line
    }
}

/// Parses `text`, the front matter that starts on line `first_line` of
/// its file, into one node; `Err` is (line, why).
pub(super) fn parse(text: &str, first_line: usize) -> Result<Node, (usize, String)> {
    let shift = first_line.saturating_sub(1);
    let docs = MarkedYaml::load_from_str(text)
        .map_err(|e| (e.marker().line() + shift, format!("not YAML: {}", e.info())))?;
    match docs.len() {
        0 => Ok(Node {
            line: first_line,
            chars: 0..0,
            kind: Kind::Null,
        }),
        1 => docs
            .first()
            .map_or(Err((first_line, "empty".to_owned())), |d| node(d, shift)),
        _ => Err((first_line, "holds more than one YAML document".to_owned())),
    }
}

fn node(yaml: &MarkedYaml<'_>, shift: usize) -> Result<Node, (usize, String)> {
    let line = yaml.span.start.line() + shift;
    let kind = match &yaml.data {
        YamlData::Value(scalar) => scalar_kind(scalar),
        YamlData::Representation(text, _, _) => Kind::Str(text.to_string()),
        YamlData::Tagged(_, inner) => return node(inner, shift),
        YamlData::Sequence(items) => Kind::Seq(
            items
                .iter()
                .map(|i| node(i, shift))
                .collect::<Result<_, _>>()?,
        ),
        YamlData::Mapping(entries) => {
            let mut out = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                let key_line = key.span.start.line() + shift;
                let name = match node(key, shift)?.kind {
                    Kind::Str(s) => s,
                    Kind::Int(i) => i.to_string(),
                    Kind::Bool(b) => b.to_string(),
                    Kind::Float(f) => f.to_string(),
                    Kind::Null => "null".to_owned(),
                    _ => return Err((key_line, "a mapping key must be text".to_owned())),
                };
                out.push((name, key_line, node(value, shift)?));
            }
            Kind::Map(out)
        }
        YamlData::Alias(_) => {
            return Err((
                line,
                "YAML aliases (*name) are not supported here".to_owned(),
            ));
        }
        YamlData::BadValue => return Err((line, "not a YAML value".to_owned())),
    };
    Ok(Node {
        line,
        chars: yaml.span.start.index()..yaml.span.end.index(),
        kind,
    })
}

fn scalar_kind(scalar: &Scalar<'_>) -> Kind {
    match scalar {
        Scalar::Null => Kind::Null,
        Scalar::Boolean(b) => Kind::Bool(*b),
        Scalar::Integer(i) => Kind::Int(*i),
        Scalar::FloatingPoint(f) => Kind::Float(f.0),
        Scalar::String(s) => Kind::Str(s.to_string()),
    }
}

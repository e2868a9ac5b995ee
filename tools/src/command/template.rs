//! The `{name}` templates of a command tool's argv and stdin (see the parent
//! module's docs for the rules).

use std::borrow::Cow;

use serde_json::Value;

/// One piece of a template.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Piece {
    Text(String),
    Field(String),
}

/// What is wrong with a `{name}` template (each at its byte offset).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum TemplateError {
    /// A `{` without its `}`.
    #[error("unclosed `{{` at byte {0} (write `{{{{` for a literal brace)")]
    Unclosed(usize),
    /// A `{}` naming nothing.
    #[error("empty placeholder `{{}}` at byte {0} (write `{{{{}}}}` for literal braces)")]
    Empty(usize),
    /// A `}` without its `{`.
    #[error("unmatched `}}` at byte {0} (write `}}}}` for a literal brace)")]
    Unmatched(usize),
}

/// A parsed `{name}` template.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    pub(super) fn parse(source: &str) -> Result<Template, TemplateError> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = source.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.next_if(|&(_, c)| c == '{').is_some() => text.push('{'),
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some((_, '}')) => break,
                            Some((_, '{')) | None => {
                                return Err(TemplateError::Unclosed(at));
                            }
                            Some((_, c)) => name.push(c),
                        }
                    }
                    if name.is_empty() {
                        return Err(TemplateError::Empty(at));
                    }
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Field(name));
                }
                '}' if chars.next_if(|&(_, c)| c == '}').is_some() => text.push('}'),
                '}' => {
                    return Err(TemplateError::Unmatched(at));
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Template { pieces })
    }

    pub(super) fn fields(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Field(name) => Some(name.as_str()),
            Piece::Text(_) => None,
        })
    }

    /// The rendered text, or None if a field is absent from `input`.
    pub(super) fn render(&self, input: &Value) -> Option<String> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Field(name) => out.push_str(&value_text(input.get(name)?)?),
            }
        }
        Some(out)
    }

    /// The rendered text, with absent fields as empty strings.
    pub(super) fn render_or_empty(&self, input: &Value) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Field(name) => {
                    if let Some(text) = input.get(name).and_then(value_text) {
                        out.push_str(&text);
                    }
                }
            }
        }
        out
    }
}

/// A value's text in a template: a string as is, others as JSON text; None
/// for `null` (which counts as absent).
pub(super) fn value_text(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(Cow::Borrowed(s)),
        other => Some(Cow::Owned(other.to_string())),
    }
}

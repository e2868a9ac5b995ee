//! The names the model sees: a leaf module (templates name their native
//! output schema with it, toolboxes their tools).

/// The longest tool name both OpenAI (`^[a-zA-Z0-9_-]{1,64}$`) and Anthropic accept.
pub const MAX_WIRE_NAME: usize = 64;

/// The name the model sees for a tool: `/` (an MCP server's namespace) becomes
/// `__`, any other character outside `[A-Za-z0-9_-]` becomes `_`, and a name
/// longer than [`MAX_WIRE_NAME`] keeps its start and ends in a hash of the
/// whole name. The toolbox maps it back exactly (it is keyed by it).
pub fn wire_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    for c in name.chars() {
        match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' => out.push(c),
            '/' => out.push_str("__"),
            _ => out.push('_'),
        }
    }
    if out.is_empty() {
        out.push('_');
    }
    if out.len() > MAX_WIRE_NAME {
        out.truncate(MAX_WIRE_NAME - 9);
        out.push('_');
        out.push_str(&short_hash(name));
    }
    out
}

/// Eight hex digits of FNV-1a: stable across builds and platforms.
pub(crate) fn short_hash(name: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

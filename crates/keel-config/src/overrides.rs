//! `KEEL_*` environment overrides. `KEEL_A__B__C` sets the key `a.b.c`; an
//! element of an array of tables is picked by its `name`/`id` or its index
//! (`KEEL_PROVIDERS__MAIN__BASE_URL`, `KEEL_AGENTS__0__LIMITS__MAX_STEPS`).
//! Variables without `__` are left alone, except the short server aliases,
//! because they are usually secrets such as `KEEL_KEY_ACME`.

use toml::de::DeValue;

use crate::env::Env;
use crate::findings::Findings;
use crate::schema::{self, Field, Ty};
use crate::tree::{Entry, KeyPath, Node, Origin, Val};

const ALIASES: &[(&str, &str)] = &[
    ("BIND", "bind"),
    ("DATA_DIR", "data_dir"),
    ("DATABASE_URL", "database_url"),
];

struct Override {
    var: String,
    segments: Vec<String>,
    raw: String,
}

/// Applies every override in the environment, in name order, reporting
/// those that name no known key.
pub(crate) fn apply(root: &mut Node, env: &dyn Env, found: &mut Findings) {
    for ov in collect(env) {
        apply_one(root, &ov, found);
    }
}

fn collect(env: &dyn Env) -> Vec<Override> {
    let mut out: Vec<Override> = env
        .vars()
        .into_iter()
        .filter_map(|(var, raw)| {
            let upper = var.to_ascii_uppercase();
            let rest = upper.strip_prefix("KEEL_")?;
            let segments = if let Some((_, key)) = ALIASES.iter().find(|(a, _)| *a == rest) {
                vec!["server".to_string(), (*key).to_string()]
            } else if rest.contains("__") {
                rest.split("__").map(str::to_ascii_lowercase).collect()
            } else {
                return None;
            };
            Some(Override { var, segments, raw })
        })
        .collect();
    out.sort_by(|a, b| a.var.cmp(&b.var));
    out
}

enum Scope {
    Fields(&'static [Field]),
    MapOf(&'static Ty),
    Json,
}

fn apply_one(root: &mut Node, ov: &Override, found: &mut Findings) {
    let origin = Origin::Env(ov.var.clone());
    let mut node = root;
    let mut scope = Scope::Fields(schema::ROOT);
    let mut path = KeyPath::root();
    let mut i = 0;
    while let Some(seg) = ov.segments.get(i) {
        if seg.is_empty() {
            found.error(
                &path,
                Some(&origin),
                "override has an empty segment (\"___\" or a trailing \"__\")".into(),
            );
            return;
        }
        let last = i + 1 == ov.segments.len();
        let child_ty: &'static Ty = match scope {
            Scope::Fields(fields) => match schema::field(fields, seg) {
                Some(f) => &f.ty,
                None => {
                    let message = schema::unknown_key_message(seg, fields);
                    found.error(&path.key(seg), Some(&origin), message);
                    return;
                }
            },
            Scope::MapOf(ty) => ty,
            Scope::Json => &Ty::Json,
        };
        path = path.key(seg);
        if last {
            set(node, seg, value_for(child_ty, &ov.raw, &origin));
            return;
        }
        if !matches!(
            child_ty,
            Ty::Table(_) | Ty::Map(_) | Ty::Json | Ty::Tables { .. }
        ) {
            found.error(
                &path,
                Some(&origin),
                format!(
                    "is {}, so an override cannot name a key inside it",
                    child_ty.describe()
                ),
            );
            return;
        }
        let child = match child_table(node, seg, &origin, child_ty) {
            Ok(child) => child,
            Err(message) => {
                found.error(&path, Some(&origin), message);
                return;
            }
        };
        node = child;
        i += 1;
        scope = match child_ty {
            Ty::Table(fields) => Scope::Fields(fields),
            Ty::Map(value_ty) => Scope::MapOf(value_ty),
            Ty::Json => Scope::Json,
            Ty::Tables { fields, key } => {
                // `node` is the array; the next segment picks an element.
                let selector = &ov.segments[i];
                let Some(index) = select(node, selector, *key) else {
                    let known = element_names(node, *key);
                    found.error(
                        &path,
                        Some(&origin),
                        format!(
                            "no element {selector:?} to override{}",
                            if known.is_empty() {
                                String::new()
                            } else {
                                format!(" (known: {})", known.join(", "))
                            }
                        ),
                    );
                    return;
                };
                path = path.index(index);
                i += 1;
                if i == ov.segments.len() {
                    found.error(
                        &path,
                        Some(&origin),
                        "override names an element, not a key inside it".into(),
                    );
                    return;
                }
                let Val::Array(items) = &mut node.value else {
                    return;
                };
                let Some(item) = items.get_mut(index) else {
                    return;
                };
                if !matches!(item.value, Val::Table(_)) {
                    // Reported by validation; nothing to override inside.
                    return;
                }
                node = item;
                Scope::Fields(fields)
            }
            // Leaf types were turned away above.
            _ => return,
        };
    }
}

/// The existing child value to descend into, or a new empty table. For an
/// array of tables the child is the array itself, which must exist.
fn child_table<'a>(
    node: &'a mut Node,
    key: &str,
    origin: &Origin,
    ty: &Ty,
) -> Result<&'a mut Node, String> {
    let Val::Table(entries) = &mut node.value else {
        return Err("the enclosing value is not a table".into());
    };
    let wants_array = matches!(ty, Ty::Tables { .. });
    let pos = match entries.iter().position(|e| e.key == key) {
        Some(pos) => pos,
        None if wants_array => {
            return Err("no element to override: the file defines none".into());
        }
        None => {
            entries.push(Entry {
                key: key.to_string(),
                node: Node::new(Val::Table(Vec::new()), origin.clone()),
            });
            entries.len() - 1
        }
    };
    let child = &mut entries[pos].node;
    let fits = if wants_array {
        matches!(child.value, Val::Array(_))
    } else {
        matches!(child.value, Val::Table(_))
    };
    if fits {
        Ok(child)
    } else {
        Err(format!(
            "cannot override inside it: the file sets it to {}",
            child.describe()
        ))
    }
}

fn select(array: &Node, selector: &str, key: Option<&str>) -> Option<usize> {
    let Val::Array(items) = &array.value else {
        return None;
    };
    if let Some(key) = key {
        let by_name = items.iter().position(|item| {
            item.get(key)
                .and_then(Node::as_str)
                .is_some_and(|name| name.eq_ignore_ascii_case(selector))
        });
        if by_name.is_some() {
            return by_name;
        }
    }
    selector.parse::<usize>().ok().filter(|i| *i < items.len())
}

fn element_names(array: &Node, key: Option<&str>) -> Vec<String> {
    let Val::Array(items) = &array.value else {
        return Vec::new();
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            key.and_then(|k| item.get(k))
                .and_then(Node::as_str)
                .map_or_else(|| i.to_string(), str::to_string)
        })
        .collect()
}

fn set(table: &mut Node, key: &str, node: Node) {
    let Val::Table(entries) = &mut table.value else {
        return;
    };
    match entries.iter_mut().find(|e| e.key == key) {
        Some(entry) => entry.node = node,
        None => entries.push(Entry {
            key: key.to_string(),
            node,
        }),
    }
}

/// Text fields take the variable verbatim (a quoted TOML string is
/// unquoted); other fields parse it as a TOML value and fall back to a
/// string, which validation then reports as the wrong type.
fn value_for(ty: &Ty, raw: &str, origin: &Origin) -> Node {
    let parsed = DeValue::parse(raw).ok();
    if ty.is_textual() {
        let text = match parsed.as_ref().map(|v| v.get_ref()) {
            Some(DeValue::String(s)) => s.to_string(),
            _ => raw.to_string(),
        };
        return Node::new(Val::Str(text), origin.clone());
    }
    match parsed {
        Some(value) => crate::tree::from_env_value(&value, origin),
        None => Node::new(Val::Str(raw.to_string()), origin.clone()),
    }
}

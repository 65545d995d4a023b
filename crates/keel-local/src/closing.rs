//! The forced close: when the output budget is spent, the rest of the reply
//! is not sampled but completed by the grammar itself, choosing at every
//! step the allowed byte that ends the current value soonest. The result is
//! always a complete action that matches the schema, however the model used
//! its budget.

use llguidance::Matcher;
use llguidance::toktrie::{TokTrie, TokenId};

use crate::json_state::JsonState;

/// A forced close longer than this means the grammar cannot end (a bug).
const MAX_CLOSE_STEPS: usize = 1024;

/// Inside a string: end it.
const IN_STRING: &[u8] = b"\"";
/// Between values: close containers first, then the shortest values.
const BETWEEN: &[u8] = b"}]\"0ftn[{,:-.e";
/// Then any of these, before the rest of ASCII.
const VISIBLE: &[u8] = b".0a";

/// Completes the reply held by `matcher`; returns the tokens added.
pub(crate) fn force_close(
    matcher: &mut Matcher,
    trie: &TokTrie,
    state: &mut JsonState,
) -> Result<Vec<TokenId>, String> {
    let mut added = Vec::new();
    for _ in 0..MAX_CLOSE_STEPS {
        if state.complete() {
            return Ok(added);
        }
        let forced = matcher.compute_ff_tokens();
        if !forced.is_empty() {
            consume(matcher, trie, state, &forced)?;
            added.extend(forced);
            continue;
        }
        let mask = matcher.compute_mask().map_err(|e| e.to_string())?;
        let preferred = if state.in_string() {
            IN_STRING
        } else {
            BETWEEN
        };
        let single = |b: u8| trie.token_id(&[b]).filter(|t| mask.is_allowed(*t));
        // A string that may not end yet gets visible text, never bare spaces.
        let choice = preferred
            .iter()
            .chain(VISIBLE)
            .find_map(|b| single(*b))
            .or_else(|| (0x20u8..0x7f).find_map(single))
            .or_else(|| {
                // Any allowed token that is not end-of-sequence.
                let eos = trie.eos_token();
                let mut found = None;
                mask.iter_set_entries(|i| {
                    let t = i as TokenId;
                    if found.is_none() && t != eos && !trie.token(t).is_empty() {
                        found = Some(t);
                    }
                });
                found
            })
            .ok_or_else(|| "the grammar allows no way to close the reply".to_string())?;
        consume(matcher, trie, state, &[choice])?;
        added.push(choice);
    }
    Err("the forced close did not end".into())
}

fn consume(
    matcher: &mut Matcher,
    trie: &TokTrie,
    state: &mut JsonState,
    tokens: &[TokenId],
) -> Result<(), String> {
    matcher.consume_tokens(tokens).map_err(|e| e.to_string())?;
    for t in tokens {
        state.feed(trie.token(*t));
    }
    Ok(())
}

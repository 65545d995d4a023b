//! The worker thread: it owns the model and its context, takes jobs one at
//! a time from a queue, keeps the evaluated prompt in the KV cache so the
//! next step of the same run only evaluates what is new, and stops a job
//! within one token once nobody waits for its answer.

use std::num::NonZeroU32;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use futures::channel::mpsc::UnboundedSender;
use futures::channel::oneshot;
use keel_protocol::{Message, ModelError, ModelRequest, ModelResponse, TokenUsage, ToolCall};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::TokEnv;
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::action_schema::{self, CLARIFY_TOOL};
use crate::closing;
use crate::error::LocalError;
use crate::json_state::{AnswerStream, JsonState, take_utf8};
use crate::prompt;
use crate::settings::LocalSettings;
use crate::template::ChatTemplate;
use crate::weights;

/// Prompt evaluation batch and micro-batch size. Measured for 300-token
/// prompts on 2 cores: 512 is as fast as 256 or 128 and faster than 64 or
/// 32 (up to 20%). llama.cpp's other context defaults are kept on purpose:
/// flash attention `auto` (on for the CPU; off was 20% slower) and an F16
/// KV cache (Q8_0 was 15–25% slower).
const N_BATCH: u32 = 512;
/// Decoded once at load time by [`Engine::warm_up`]; a handful of tokens
/// is enough to touch every weight.
const WARM_UP_TEXT: &str = "The quick brown fox jumps over the lazy dog.";
/// Context kept free beyond the output budget for the forced close.
const CLOSE_RESERVE: usize = 64;
/// Recent free-text tokens the repetition penalty looks at.
const PENALTY_LAST_N: i32 = 64;
/// Compiled action grammars kept per worker (agents reuse their tool sets).
const GRAMMAR_CACHE: usize = 8;

pub(crate) enum Job {
    Complete {
        request: ModelRequest,
        deltas: Option<UnboundedSender<String>>,
        reply: oneshot::Sender<Result<ModelResponse, ModelError>>,
    },
    /// Forget the cached prompt (benchmarks measure cold prompts).
    ClearCache,
}

/// What the caller learns once the model is loaded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Loaded {
    pub context_window: u64,
}

static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();

/// llama.cpp's backend is process-wide and may be initialised once.
fn backend() -> Result<&'static LlamaBackend, LocalError> {
    BACKEND
        .get_or_init(|| {
            let mut backend = LlamaBackend::init().map_err(|e| e.to_string())?;
            // llama.cpp narrates every load on stderr; keel has its own logs.
            backend.void_logs();
            Ok(backend)
        })
        .as_ref()
        .map_err(|e| LocalError::Backend(e.clone()))
}

/// Runs the worker until `jobs` closes; `ready` gets the load result first.
pub(crate) fn run(
    settings: LocalSettings,
    jobs: Receiver<Job>,
    ready: SyncSender<Result<Loaded, LocalError>>,
) {
    let backend = match backend() {
        Ok(b) => b,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let weights = if settings.requantize_q4_1 {
        weights::prepared(&settings.model_path)
    } else {
        settings.model_path.clone()
    };
    let params = LlamaModelParams::default();
    let loaded = LlamaModel::load_from_file(backend, &weights, &params).or_else(|e| {
        if weights == settings.model_path {
            return Err(e);
        }
        // A copy llama.cpp refuses must not cost the user the model.
        tracing::warn!(copy = %weights.display(), error = %e, "the Q8_0 copy does not load; using the original");
        LlamaModel::load_from_file(backend, &settings.model_path, &params)
    });
    let model = match loaded {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(LocalError::Load {
                path: settings.model_path.clone(),
                message: e.to_string(),
            }));
            return;
        }
    };
    let mut engine = match Engine::new(backend, &model, settings) {
        Ok(e) => e,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if let Err(e) = engine.warm_up() {
        let _ = ready.send(Err(e));
        return;
    }
    let loaded = Loaded {
        context_window: u64::from(engine.ctx.n_ctx()),
    };
    if ready.send(Ok(loaded)).is_err() {
        return;
    }
    for job in jobs {
        match job {
            Job::ClearCache => engine.clear_cache(),
            Job::Complete {
                request,
                deltas,
                reply,
            } => {
                if reply.is_canceled() {
                    continue;
                }
                let started = Instant::now();
                let result = engine.complete(&request, deltas.as_ref(), &reply);
                match &result {
                    Ok(r) => tracing::debug!(
                        model = %engine.settings.name,
                        prompt_tokens = r.usage.prompt_tokens,
                        completion_tokens = r.usage.completion_tokens,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "local completion"
                    ),
                    Err(e) => {
                        tracing::debug!(model = %engine.settings.name, error = %e, "local completion ended")
                    }
                }
                let _ = reply.send(result.map_err(ModelError::from));
            }
        }
    }
}

/// How one generation ended.
enum Ended {
    Done,
    Cancelled,
}

struct Engine<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    settings: LocalSettings,
    template: ChatTemplate,
    tok_env: TokEnv,
    factory: ParserFactory,
    grammars: Vec<(String, Matcher)>,
    /// Tokens whose keys and values are in the KV cache, in order.
    cached: Vec<LlamaToken>,
    /// Batch index of the logits the next token is sampled from.
    last_logits_index: i32,
}

impl<'m> Engine<'m> {
    fn new(
        backend: &LlamaBackend,
        model: &'m LlamaModel,
        settings: LocalSettings,
    ) -> Result<Self, LocalError> {
        let trained = model.n_ctx_train().max(512);
        let n_ctx = settings.context_window.map_or(trained, |w| {
            u32::try_from(w).unwrap_or(u32::MAX).clamp(512, trained)
        });
        let threads = i32::try_from(settings.effective_threads()).unwrap_or(1);
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(n_ctx))
            .with_n_batch(N_BATCH)
            .with_n_ubatch(N_BATCH)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let ctx = model
            .new_context(backend, params)
            .map_err(|e| LocalError::Context(e.to_string()))?;
        let template = ChatTemplate::detect(model)?;
        let tok_env = LlamaSampler::llguidance_tok_env(model);
        let mut factory =
            ParserFactory::new_simple(&tok_env).map_err(|e| LocalError::Grammar(e.to_string()))?;
        factory.quiet();
        tracing::info!(
            model = %settings.name,
            path = %settings.model_path.display(),
            context_window = n_ctx,
            threads,
            template = ?template,
            "local model loaded"
        );
        Ok(Self {
            model,
            ctx,
            settings,
            template,
            tok_env,
            factory,
            grammars: Vec::new(),
            cached: Vec::new(),
            last_logits_index: 0,
        })
    }

    /// Decodes a few tokens and forgets them, so that the one-off costs of
    /// the first decode are paid while loading (the product loads a model
    /// once per process) instead of by the first request: touching every
    /// weight page of the memory-mapped GGUF (read from disk when it is not
    /// in the page cache) and the first use of the compute and KV buffers.
    /// Measured: with the GGUF just evicted from the page cache the first
    /// request came ~120 ms later without it; with a warm page cache it
    /// makes no difference. It costs ~40 ms of loading.
    fn warm_up(&mut self) -> Result<(), LocalError> {
        let vocab = self.model.vocab();
        let tokens = vocab.tokenize(WARM_UP_TEXT.as_bytes(), vocab.should_add_bos(), false);
        let Some(last) = tokens.len().checked_sub(1) else {
            return Ok(());
        };
        let started = Instant::now();
        let mut batch = LlamaBatch::new(tokens.len(), 1);
        for (i, t) in tokens.iter().enumerate() {
            let pos = i32::try_from(i).map_err(|e| LocalError::Inference(e.to_string()))?;
            batch
                .add(*t, pos, &[0], i == last)
                .map_err(|e| LocalError::Inference(e.to_string()))?;
        }
        self.ctx
            .decode(&mut batch)
            .map_err(|e| LocalError::Inference(e.to_string()))?;
        // Logits are read so the output layer's weights are touched too.
        let _ = self.ctx.get_logits_ith(batch.n_tokens() - 1);
        self.clear_cache();
        tracing::debug!(
            model = %self.settings.name,
            tokens = tokens.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "local model warmed up"
        );
        Ok(())
    }

    fn clear_cache(&mut self) {
        self.ctx.clear_kv_cache();
        self.cached.clear();
    }

    fn complete(
        &mut self,
        request: &ModelRequest,
        deltas: Option<&UnboundedSender<String>>,
        reply: &oneshot::Sender<Result<ModelResponse, ModelError>>,
    ) -> Result<ModelResponse, LocalError> {
        let (tools, clarify) = action_schema::split_tools(&request.tools);
        let n_ctx = self.ctx.n_ctx() as usize;
        let budget = request
            .max_output_tokens
            .unwrap_or(self.settings.max_output_tokens)
            .clamp(1, u32::try_from(n_ctx / 4).unwrap_or(u32::MAX).max(1));
        let protocol = (!tools.is_empty()).then(|| prompt::protocol(&tools, clarify));
        let tokens = self.fit_prompt(
            &request.messages,
            protocol.as_deref(),
            n_ctx.saturating_sub(budget as usize + CLOSE_RESERVE),
        )?;
        let mut matcher = if tools.is_empty() {
            None
        } else {
            Some(self.matcher(&action_schema::action_schema(&tools, clarify, budget))?)
        };
        if let Ended::Cancelled = self.eval_prompt(&tokens, reply)? {
            return Err(LocalError::Inference("cancelled".into()));
        }
        let mut penalties = LlamaSampler::penalties(
            self.model.n_vocab(),
            PENALTY_LAST_N,
            self.settings.repeat_penalty,
            0.0,
            0.0,
        );
        let mut state = JsonState::default();
        let mut answer = AnswerStream::default();
        let mut output: Vec<u8> = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        let mut generated: u64 = 0;
        let mut truncated = false;
        let mut logits_at = self.last_logits_index;
        loop {
            if reply.is_canceled() {
                return Err(LocalError::Inference("cancelled".into()));
            }
            if generated >= u64::from(budget) {
                truncated = true;
                break;
            }
            let token = self.pick(logits_at, matcher.as_mut(), &mut penalties)?;
            generated += 1;
            let Some(token) = token else { break };
            let bytes = match matcher.as_mut() {
                Some(m) => {
                    let t = token.0.cast_unsigned();
                    let was_in_string = state.in_string();
                    m.consume_token(t)
                        .map_err(|e| LocalError::Grammar(e.to_string()))?;
                    let bytes = self.tok_env.tok_trie().token(t).to_vec();
                    state.feed(&bytes);
                    if was_in_string || state.in_string() {
                        penalties.accept(token);
                    }
                    if let (Some(text), Some(d)) = (answer.feed(&bytes), deltas) {
                        let _ = d.unbounded_send(text);
                    }
                    bytes
                }
                None => {
                    if self.model.vocab().is_eog(token) {
                        break;
                    }
                    penalties.accept(token);
                    let bytes = self.model.vocab().token_to_piece(token, false, None);
                    pending.extend_from_slice(&bytes);
                    if let (Some(text), Some(d)) = (take_utf8(&mut pending), deltas) {
                        let _ = d.unbounded_send(text);
                    }
                    bytes
                }
            };
            output.extend_from_slice(&bytes);
            if matcher.is_some() && state.complete() {
                break;
            }
            self.decode_one(token)?;
            logits_at = 0;
        }
        if let Some(m) = matcher.as_mut()
            && !state.complete()
        {
            let trie = self.tok_env.tok_trie();
            let added = closing::force_close(m, trie, &mut state).map_err(LocalError::Grammar)?;
            for t in &added {
                let bytes = trie.token(*t);
                output.extend_from_slice(bytes);
                if let (Some(text), Some(d)) = (answer.feed(bytes), deltas) {
                    let _ = d.unbounded_send(text);
                }
            }
            generated += added.len() as u64;
            truncated = true;
        }
        let usage = TokenUsage {
            prompt_tokens: tokens.len() as u64,
            completion_tokens: generated,
        };
        let finish = if truncated { "length" } else { "stop" };
        let text = String::from_utf8_lossy(&output).into_owned();
        if matcher.is_some() {
            action_response(&text, usage, finish)
        } else {
            if let (Some(rest), Some(d)) = (take_utf8(&mut pending), deltas)
                && !rest.is_empty()
            {
                let _ = d.unbounded_send(rest);
            }
            Ok(ModelResponse {
                text: text.trim().to_owned(),
                tool_calls: Vec::new(),
                usage,
                finish_reason: Some(finish.into()),
                understanding: Default::default(),
            })
        }
    }

    /// The prompt tokens, dropping the oldest turns (never the system
    /// prompt or the last message) until they fit in `limit`.
    fn fit_prompt(
        &self,
        messages: &[Arc<Message>],
        protocol: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LlamaToken>, LocalError> {
        let mut kept: Vec<Arc<Message>> = messages.to_vec();
        loop {
            let text = self
                .template
                .render(self.model, &prompt::render(&kept, protocol))?;
            let vocab = self.model.vocab();
            let add_bos = vocab.should_add_bos() && {
                let bos = vocab.token_to_piece(vocab.bos(), true, None);
                !bos.is_empty() && !text.as_bytes().starts_with(&bos)
            };
            let tokens = vocab.tokenize(text.as_bytes(), add_bos, true);
            if tokens.len() <= limit {
                return Ok(tokens);
            }
            let droppable = kept
                .iter()
                .enumerate()
                .filter(|(_, m)| !matches!(m.as_ref(), Message::System { .. }))
                .map(|(i, _)| i)
                .collect::<Vec<_>>();
            match droppable.as_slice() {
                [first, _, ..] => {
                    kept.remove(*first);
                }
                _ => {
                    return Err(LocalError::PromptTooLong {
                        needed: tokens.len(),
                        window: limit,
                    });
                }
            }
        }
    }

    fn matcher(&mut self, schema: &Value) -> Result<Matcher, LocalError> {
        let key = schema.to_string();
        if let Some((_, m)) = self.grammars.iter().find(|(k, _)| *k == key) {
            return Ok(m.deep_clone());
        }
        let grammar = TopLevelGrammar::from_json_schema(schema.clone());
        let matcher = Matcher::new(self.factory.create_parser(grammar));
        if let Some(e) = matcher.get_error() {
            return Err(LocalError::Grammar(e));
        }
        if self.grammars.len() >= GRAMMAR_CACHE {
            self.grammars.remove(0);
        }
        let copy = matcher.deep_clone();
        self.grammars.push((key, matcher));
        Ok(copy)
    }

    /// Evaluates `tokens`, reusing the cached prefix; leaves the logits of
    /// the last token at `last_logits_index`.
    fn eval_prompt(
        &mut self,
        tokens: &[LlamaToken],
        reply: &oneshot::Sender<Result<ModelResponse, ModelError>>,
    ) -> Result<Ended, LocalError> {
        let Some(last) = tokens.len().checked_sub(1) else {
            return Err(LocalError::Inference("empty prompt".into()));
        };
        // The last prompt token is always evaluated again: its logits are needed.
        let mut common = self
            .cached
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(last);
        if common < self.cached.len() {
            let removed = self
                .ctx
                .clear_kv_cache_seq(Some(0), u32::try_from(common).ok(), None)
                .unwrap_or(false);
            if !removed {
                self.ctx.clear_kv_cache();
                common = 0;
            }
            self.cached.truncate(common);
        }
        let mut batch = LlamaBatch::new(N_BATCH as usize, 1);
        let mut pos = common;
        for chunk in tokens[common..].chunks(N_BATCH as usize) {
            if reply.is_canceled() {
                return Ok(Ended::Cancelled);
            }
            batch.clear();
            for t in chunk {
                let pos_i = i32::try_from(pos).map_err(|e| LocalError::Inference(e.to_string()))?;
                batch
                    .add(*t, pos_i, &[0], pos == last)
                    .map_err(|e| LocalError::Inference(e.to_string()))?;
                pos += 1;
            }
            self.ctx
                .decode(&mut batch)
                .map_err(|e| LocalError::Inference(e.to_string()))?;
            self.cached.extend_from_slice(chunk);
        }
        self.last_logits_index = batch.n_tokens() - 1;
        Ok(Ended::Done)
    }

    fn decode_one(&mut self, token: LlamaToken) -> Result<(), LocalError> {
        let pos =
            i32::try_from(self.cached.len()).map_err(|e| LocalError::Inference(e.to_string()))?;
        let mut batch = LlamaBatch::new(1, 1);
        batch
            .add(token, pos, &[0], true)
            .map_err(|e| LocalError::Inference(e.to_string()))?;
        self.ctx
            .decode(&mut batch)
            .map_err(|e| LocalError::Inference(e.to_string()))?;
        self.cached.push(token);
        Ok(())
    }

    /// The next token: the grammar's mask, then the repetition penalty,
    /// then the most likely. `None` when nothing is allowed.
    fn pick(
        &self,
        logits_at: i32,
        matcher: Option<&mut Matcher>,
        penalties: &mut LlamaSampler,
    ) -> Result<Option<LlamaToken>, LocalError> {
        let logits = self.ctx.get_logits_ith(logits_at);
        let data: Vec<LlamaTokenData> = match matcher {
            Some(m) => {
                let mask = m
                    .compute_mask()
                    .map_err(|e| LocalError::Grammar(e.to_string()))?;
                let mut data = Vec::new();
                mask.iter_set_entries(|i| {
                    if let Some(l) = logits.get(i) {
                        data.push(LlamaTokenData::new(LlamaToken(i as i32), *l, 0.0));
                    }
                });
                data
            }
            None => logits
                .iter()
                .enumerate()
                .map(|(i, l)| LlamaTokenData::new(LlamaToken(i as i32), *l, 0.0))
                .collect(),
        };
        if data.is_empty() {
            return Ok(None);
        }
        let mut array = LlamaTokenDataArray::new(data, false);
        array.apply_sampler(penalties);
        Ok(array
            .data
            .iter()
            .filter(|d| !d.logit().is_nan())
            .max_by(|a, b| a.logit().total_cmp(&b.logit()))
            .map(LlamaTokenData::id))
    }
}

/// The reply mapped as a native provider's would be: `respond` is text, a
/// tool call is one call, `clarify` is a call of the reserved function.
pub(crate) fn action_response(
    text: &str,
    usage: TokenUsage,
    finish: &str,
) -> Result<ModelResponse, LocalError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| LocalError::Grammar(format!("constrained reply is not JSON ({e}): {text}")))?;
    let field = |k: &str| value.get(k).cloned().unwrap_or(Value::Null);
    let call = |name: &str, arguments: Value| ToolCall {
        id: format!("call_{}", uuid::Uuid::now_v7().simple()),
        name: name.to_owned(),
        arguments: arguments.to_string(),
    };
    let (text, tool_calls) = match value.get("action").and_then(Value::as_str) {
        Some("respond") => (
            field("answer").as_str().unwrap_or_default().to_owned(),
            Vec::new(),
        ),
        Some("call_tool") => {
            let name = field("tool_name").as_str().unwrap_or_default().to_owned();
            (String::new(), vec![call(&name, field("arguments"))])
        }
        Some("clarify") => (
            String::new(),
            vec![call(
                CLARIFY_TOOL,
                json!({
                    "tool_name": field("tool_name"),
                    "missing_slots": field("missing_slots"),
                    "question": field("question"),
                }),
            )],
        ),
        _ => {
            return Err(LocalError::Grammar(format!(
                "constrained reply has no known action: {text}"
            )));
        }
    };
    let finish_reason = if tool_calls.is_empty() {
        finish.to_owned()
    } else {
        "tool_calls".to_owned()
    };
    Ok(ModelResponse {
        text,
        tool_calls,
        usage,
        finish_reason: Some(finish_reason),
        understanding: value
            .as_object()
            .map(keel_protocol::Understanding::from_object)
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_map_like_json_mode() {
        let usage = TokenUsage::default();
        let r = action_response(r#"{"action":"respond","answer":"hi"}"#, usage, "stop").unwrap();
        assert_eq!(r.text, "hi");
        assert!(r.tool_calls.is_empty());
        assert_eq!(r.finish_reason.as_deref(), Some("stop"));
        let r = action_response(
            r#"{"action":"call_tool","tool_name":"f","arguments":{"a":1}}"#,
            usage,
            "stop",
        )
        .unwrap();
        assert_eq!(r.tool_calls[0].name, "f");
        assert_eq!(r.tool_calls[0].arguments, r#"{"a":1}"#);
        assert!(r.tool_calls[0].id.starts_with("call_"));
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        let r = action_response(
            r#"{"action":"clarify","tool_name":"f","missing_slots":["a"],"question":"which?"}"#,
            usage,
            "stop",
        )
        .unwrap();
        assert_eq!(r.tool_calls[0].name, CLARIFY_TOOL);
        let args: Value = serde_json::from_str(&r.tool_calls[0].arguments).unwrap();
        assert_eq!(
            args,
            json!({"tool_name":"f","missing_slots":["a"],"question":"which?"})
        );
        assert!(action_response("{}", usage, "stop").is_err());
    }
}

//! Chat templates come from the GGUF. llama.cpp renders the templates it
//! recognises; any other Jinja template is rendered with minijinja, so a
//! new model family works without waiting for llama.cpp to learn it.

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use serde::Serialize;

use crate::error::LocalError;

/// One turn, already reduced to a role the template knows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Turn {
    pub role: &'static str,
    pub content: String,
}

pub(crate) enum ChatTemplate {
    /// llama.cpp's own renderer (by template text, or `chatml` when the GGUF has none).
    Builtin(LlamaChatTemplate),
    /// The GGUF's Jinja source, rendered with minijinja.
    Jinja {
        source: String,
        bos: String,
        eos: String,
    },
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Builtin(_) => f.write_str("ChatTemplate::Builtin"),
            Self::Jinja { .. } => f.write_str("ChatTemplate::Jinja"),
        }
    }
}

impl ChatTemplate {
    /// The model's template, and who renders it.
    pub(crate) fn detect(model: &LlamaModel) -> Result<Self, LocalError> {
        let probe = [LlamaChatMessage::new("user".into(), "hi".into())
            .map_err(|e| LocalError::Template(e.to_string()))?];
        match model.chat_template(None) {
            Ok(template) => {
                if model.apply_chat_template(&template, &probe, true).is_ok() {
                    return Ok(Self::Builtin(template));
                }
                let source = template
                    .to_string()
                    .map_err(|e| LocalError::Template(e.to_string()))?;
                let piece = |t| {
                    String::from_utf8_lossy(&model.vocab().token_to_piece(t, true, None))
                        .into_owned()
                };
                tracing::debug!("llama.cpp does not know this chat template; using minijinja");
                Ok(Self::Jinja {
                    source,
                    bos: piece(model.vocab().bos()),
                    eos: piece(model.vocab().eos()),
                })
            }
            Err(_) => {
                tracing::debug!("the GGUF has no chat template; using chatml");
                LlamaChatTemplate::new("chatml")
                    .map(Self::Builtin)
                    .map_err(|e| LocalError::Template(e.to_string()))
            }
        }
    }

    /// The prompt text for `turns`, ending where the assistant speaks next.
    pub(crate) fn render(&self, model: &LlamaModel, turns: &[Turn]) -> Result<String, LocalError> {
        match self {
            Self::Builtin(template) => {
                let chat = turns
                    .iter()
                    .map(|t| LlamaChatMessage::new(t.role.into(), t.content.replace('\0', "")))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| LocalError::Template(e.to_string()))?;
                model
                    .apply_chat_template(template, &chat, true)
                    .map_err(|e| LocalError::Template(e.to_string()))
            }
            Self::Jinja { source, bos, eos } => render_jinja(source, bos, eos, turns),
        }
    }
}

/// Renders a Hugging Face style chat template.
pub(crate) fn render_jinja(
    source: &str,
    bos: &str,
    eos: &str,
    turns: &[Turn],
) -> Result<String, LocalError> {
    let mut env = minijinja::Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        },
    );
    env.add_template("chat", source)
        .map_err(|e| LocalError::Template(e.to_string()))?;
    let template = env
        .get_template("chat")
        .map_err(|e| LocalError::Template(e.to_string()))?;
    template
        .render(minijinja::context! {
            messages => turns,
            add_generation_prompt => true,
            bos_token => bos,
            eos_token => eos,
        })
        .map_err(|e| LocalError::Template(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_template_llama_cpp_does_not_know() {
        let source = "{{ bos_token }}{% for m in messages %}[{{ m.role | upper }}] {{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}";
        let turns = [
            Turn {
                role: "system",
                content: "be brief ".into(),
            },
            Turn {
                role: "user",
                content: "hi".into(),
            },
        ];
        let text = render_jinja(source, "<s>", "</s>", &turns).unwrap();
        assert_eq!(text, "<s>[SYSTEM] be brief\n[USER] hi\n[ASSISTANT]");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let source =
            "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}";
        let turns = [Turn {
            role: "system",
            content: "x".into(),
        }];
        let err = render_jinja(source, "", "", &turns).unwrap_err();
        assert!(err.to_string().contains("user first"), "{err}");
    }
}

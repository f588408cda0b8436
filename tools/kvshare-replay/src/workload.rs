//! Built-in workloads, generated deterministically from a seed.
//!
//! * [`ChatWorkload`]: the source article's experiment (multi-turn chat, one long system prompt
//!   shared by every user, 10 turns of about 200 new tokens each, every prompt repeating the whole
//!   history), with some parallel-sampling requests (`n = 2`) so copy-on-write is exercised.
//! * [`SharedPrefixWorkload`]: requests whose first `share_ratio` of tokens is one common prefix
//!   (the article's section 5.1 sweep).

use super::rng::Rng;
use super::trace::Request;

/// Multi-turn chat: `users` conversations of `turns` turns.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatWorkload {
    /// Conversations.
    pub users: usize,
    /// Turns per conversation.
    pub turns: usize,
    /// Tokens of the system prompt every conversation starts with.
    pub system_tokens: usize,
    /// New user tokens per turn, uniform in `lo..=hi`.
    pub user_tokens: (usize, usize),
    /// Generated tokens per turn, uniform in `lo..=hi`.
    pub output_tokens: (usize, usize),
    /// Every `fork_every`-th request (counted over all requests) samples two answers (`n = 2`);
    /// 0: none. The conversation continues with the first answer.
    pub fork_every: usize,
    /// Pause between a reply and the next user turn, uniform in `lo..=hi` ms.
    pub think_ms: (u64, u64),
    /// Start of conversation `u` is `u * stagger_ms`.
    pub stagger_ms: f64,
    /// Simulated engine step, used to place the next turn after the previous reply.
    pub step_ms: f64,
    /// Token ids are uniform in `0..vocab`.
    pub vocab: u32,
    /// Seed of everything above.
    pub seed: u64,
}

impl Default for ChatWorkload {
    fn default() -> Self {
        ChatWorkload {
            users: 8,
            turns: 10,
            system_tokens: 1024,
            user_tokens: (40, 120),
            output_tokens: (80, 160),
            fork_every: 7,
            think_ms: (500, 3000),
            stagger_ms: 250.0,
            step_ms: 20.0,
            vocab: 32000,
            seed: 42,
        }
    }
}

fn tokens(rng: &mut Rng, n: usize, vocab: u32) -> Vec<i32> {
    (0..n).map(|_| rng.below(vocab as u64) as i32).collect()
}

impl ChatWorkload {
    /// The requests, sorted by arrival (ties by conversation), ids `u03-t07` (1-based turn).
    pub fn generate(&self) -> Vec<Request> {
        let system = tokens(
            &mut Rng::stream(self.seed, 0),
            self.system_tokens,
            self.vocab,
        );
        let mut reqs = Vec::with_capacity(self.users * self.turns);
        for u in 0..self.users {
            let mut rng = Rng::stream(self.seed, 1 + u as u64);
            let mut history = system.clone();
            let mut at = u as f64 * self.stagger_ms;
            for t in 0..self.turns {
                let user_n = rng.range(self.user_tokens.0 as u64, self.user_tokens.1 as u64);
                history.extend(tokens(&mut rng, user_n as usize, self.vocab));
                let out_n =
                    rng.range(self.output_tokens.0 as u64, self.output_tokens.1 as u64) as usize;
                let mut outputs = vec![tokens(&mut rng, out_n, self.vocab)];
                let k = u * self.turns + t;
                if self.fork_every > 0 && k % self.fork_every == self.fork_every - 1 {
                    let mut alt = tokens(&mut rng, out_n, self.vocab);
                    if out_n > 0 && alt[0] == outputs[0][0] {
                        alt[0] = (alt[0] + 1) % self.vocab as i32;
                    }
                    outputs.push(alt);
                }
                let answer = outputs[0].clone();
                reqs.push(Request {
                    id: format!("u{u:02}-t{:02}", t + 1),
                    session: Some(format!("u{u:02}")),
                    arrival_ms: at,
                    prompt: history.clone(),
                    outputs,
                    salt: String::new(),
                    lora: 0,
                    line: 0,
                });
                history.extend(answer);
                // The reply takes a prefill step plus one decode step per token.
                at += (out_n as f64 + 1.0) * self.step_ms
                    + rng.range(self.think_ms.0, self.think_ms.1) as f64;
            }
        }
        reqs.sort_by(|a, b| {
            a.arrival_ms
                .total_cmp(&b.arrival_ms)
                .then_with(|| a.session.cmp(&b.session))
        });
        reqs
    }

    /// One line describing the workload.
    pub fn describe(&self) -> String {
        format!(
            "built-in chat workload: {} users, shared system prompt of {} tokens, {} turns of \
             {}-{} user + {}-{} output tokens, every {}th request samples n=2, seed {}",
            self.users,
            self.system_tokens,
            self.turns,
            self.user_tokens.0,
            self.user_tokens.1,
            self.output_tokens.0,
            self.output_tokens.1,
            self.fork_every,
            self.seed
        )
    }
}

/// `requests` requests of `total_tokens` tokens each (prompt plus `output_tokens` generated),
/// all arriving at once; the first `round(share_ratio * total_tokens)` tokens are one prefix
/// common to all of them, the rest is each request's own.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedPrefixWorkload {
    /// Requests.
    pub requests: usize,
    /// Prompt plus output tokens of each request.
    pub total_tokens: usize,
    /// Generated tokens of each request (at most `total_tokens - 1`).
    pub output_tokens: usize,
    /// Shared tokens / total tokens, in `0..=1` (capped so the prompt keeps one own token).
    pub share_ratio: f64,
    /// Token ids are uniform in `0..vocab`.
    pub vocab: u32,
    /// Seed.
    pub seed: u64,
}

impl SharedPrefixWorkload {
    /// Tokens of the common prefix.
    pub fn shared_tokens(&self) -> usize {
        let prompt = self.total_tokens - self.output_tokens;
        ((self.share_ratio * self.total_tokens as f64).round() as usize).min(prompt - 1)
    }

    /// The requests, ids `r00`, `r01`, ….
    pub fn generate(&self) -> Vec<Request> {
        let shared = tokens(
            &mut Rng::stream(self.seed, 0),
            self.shared_tokens(),
            self.vocab,
        );
        let prompt_n = self.total_tokens - self.output_tokens;
        (0..self.requests)
            .map(|i| {
                let mut rng = Rng::stream(self.seed, 1 + i as u64);
                let mut prompt = shared.clone();
                prompt.extend(tokens(&mut rng, prompt_n - shared.len(), self.vocab));
                Request {
                    id: format!("r{i:02}"),
                    session: None,
                    arrival_ms: 0.0,
                    prompt,
                    outputs: vec![tokens(&mut rng, self.output_tokens, self.vocab)],
                    salt: String::new(),
                    lora: 0,
                    line: 0,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_histories_repeat() {
        let w = ChatWorkload {
            users: 3,
            turns: 4,
            ..ChatWorkload::default()
        };
        let r = w.generate();
        assert_eq!(r, w.generate(), "deterministic");
        assert_eq!(r.len(), 12);
        assert!(r.windows(2).all(|p| p[0].arrival_ms <= p[1].arrival_ms));
        let u1: Vec<&Request> = r
            .iter()
            .filter(|x| x.session.as_deref() == Some("u01"))
            .collect();
        assert_eq!(u1.len(), 4);
        for p in u1.windows(2) {
            let mut hist = p[0].prompt.clone();
            hist.extend(&p[0].outputs[0]);
            assert!(p[1].prompt.starts_with(&hist), "next turn repeats history");
            assert!(p[1].arrival_ms > p[0].arrival_ms);
        }
        assert_eq!(
            r[0].prompt[..1024],
            r[1].prompt[..1024],
            "system prompt shared"
        );
        assert_eq!(r.iter().filter(|x| x.outputs.len() == 2).count(), 1);
        let forked = r.iter().find(|x| x.outputs.len() == 2).unwrap();
        assert_ne!(forked.outputs[0][0], forked.outputs[1][0]);
    }

    #[test]
    fn shared_prefix_ratio() {
        let w = SharedPrefixWorkload {
            requests: 4,
            total_tokens: 100,
            output_tokens: 10,
            share_ratio: 0.5,
            vocab: 1000,
            seed: 1,
        };
        let r = w.generate();
        assert_eq!(w.shared_tokens(), 50);
        assert_eq!(r[0].prompt.len(), 90);
        assert_eq!(r[0].prompt[..50], r[3].prompt[..50]);
        assert_ne!(r[0].prompt[50..], r[3].prompt[50..]);
    }
}

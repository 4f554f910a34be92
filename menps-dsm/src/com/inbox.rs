//! Tag matching for point-to-point messages, shared by the backends:
//! messages that arrived but were not received yet, queued per (sender,
//! tag), FIFO within a queue, with round-robin fairness for receives from
//! any source.

use std::collections::{HashMap, VecDeque};

use super::{Result, Source, Tag};

/// Messages that arrived but were not received yet.
#[derive(Default)]
pub(crate) struct Inbox {
    queues: HashMap<(usize, Tag), VecDeque<Vec<u8>>>,
    /// Where a receive from any source starts looking (round robin).
    next_any: usize,
}

impl Inbox {
    /// Queues a message from `sender` with `tag`.
    pub(crate) fn push(&mut self, sender: usize, tag: Tag, msg: Vec<u8>) {
        self.queues.entry((sender, tag)).or_default().push_back(msg);
    }

    /// Takes the oldest message with `tag` from `from` (any of `size`
    /// processes for [`Source::Any`]), if there is one; `fits` may refuse it
    /// by its length (it then stays queued) with an error.
    pub(crate) fn take(
        &mut self,
        from: Source,
        tag: Tag,
        size: usize,
        fits: &impl Fn(usize) -> Result<()>,
    ) -> Result<Option<(usize, Vec<u8>)>> {
        let sender = match from {
            Source::Rank(s) => self.queues.contains_key(&(s, tag)).then_some(s),
            Source::Any => {
                let start = self.next_any;
                (0..size)
                    .map(|i| (start + i) % size)
                    .find(|&s| self.queues.contains_key(&(s, tag)))
            }
        };
        let Some(s) = sender else { return Ok(None) };
        let q = self.queues.get_mut(&(s, tag)).expect("queue exists");
        fits(q.front().expect("queues are never empty").len())?;
        let msg = q.pop_front().expect("queues are never empty");
        if q.is_empty() {
            self.queues.remove(&(s, tag));
        }
        if matches!(from, Source::Any) {
            self.next_any = (s + 1) % size;
        }
        Ok(Some((s, msg)))
    }
}

//! Documents gathered into batches as the readers stream them, for work
//! that spreads a batch over the cores (tokenizing for `prepare`, counting
//! words for tokenizer training).

/// Documents in a batch at most, unless its byte limit comes first.
pub(crate) const BATCH_DOCUMENTS: usize = 4096;

/// The documents waiting for the next batch of work.
pub(crate) struct DocumentBatch {
    texts: Vec<String>,
    bytes: usize,
    max_bytes: usize,
}

impl DocumentBatch {
    /// Batches of [`BATCH_DOCUMENTS`] documents or `max_bytes` of text,
    /// whichever comes first (one longer document makes a batch alone).
    pub(crate) fn new(max_bytes: usize) -> DocumentBatch {
        DocumentBatch { texts: Vec::new(), bytes: 0, max_bytes }
    }

    /// Add `text`: true when the batch is full.
    pub(crate) fn add(&mut self, text: &str) -> bool {
        self.bytes += text.len();
        self.texts.push(text.to_string());
        self.texts.len() >= BATCH_DOCUMENTS || self.bytes >= self.max_bytes
    }

    /// The documents gathered, leaving the batch empty.
    pub(crate) fn take(&mut self) -> Vec<String> {
        self.bytes = 0;
        std::mem::take(&mut self.texts)
    }
}

//! The generated demo classification task: travel reviews about the demo
//! corpus's countries whose label (`positive` / `negative`) follows from a
//! lexicon of opinion words, flipped by negation. Deterministic, learnable,
//! and not solvable by one keyword alone (negation).

use crate::corpus::Country;
use lazytrain_core::random::uniform_f32;

const POSITIVE: [&str; 12] = [
    "good",
    "great",
    "wonderful",
    "lovely",
    "excellent",
    "pleasant",
    "superb",
    "friendly",
    "beautiful",
    "fantastic",
    "charming",
    "clean",
];
const NEGATIVE: [&str; 12] =
    ["bad", "awful", "terrible", "dirty", "boring", "rude", "noisy", "horrible", "dreadful", "poor", "ugly", "crowded"];
const THINGS: [&str; 10] = ["hotel", "food", "museum", "weather", "market", "train", "beach", "room", "guide", "park"];

/// The demo task's label names, in id order.
pub const LABELS: [&str; 2] = ["negative", "positive"];

/// One generated review.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Review {
    /// The sentence.
    pub text: String,
    /// `positive` or `negative`.
    pub label: &'static str,
}

/// `count` reviews about `countries` from `seed`. About one in five is
/// negated ("was not good" is negative).
pub fn sentiment_reviews(seed: u64, countries: &[Country], count: usize) -> Vec<Review> {
    let mut u = vec![0f32; 7 * count];
    uniform_f32(seed, 0x5e47, &mut u);
    let pick = |x: f32, n: usize| ((x * n as f32) as usize).min(n - 1);
    (0..count)
        .map(|i| {
            let r = &u[7 * i..7 * i + 7];
            let positive = r[0] < 0.5;
            let negated = r[1] < 0.2;
            let words: &[&str] = if positive { &POSITIVE } else { &NEGATIVE };
            let (adjective, second) = (words[pick(r[2], words.len())], words[pick(r[5], words.len())]);
            let thing = THINGS[pick(r[3], THINGS.len())];
            let place = countries.get(pick(r[4], countries.len().max(1))).map_or("the city", |c| c.capital.as_str());
            let not = if negated { "not " } else { "" };
            let text = match pick(r[6], 4) {
                0 => format!("the {thing} in {place} was {not}{adjective} ."),
                1 => format!("our trip to {place} was {not}{adjective} ."),
                2 if negated => format!("i found the {thing} not {adjective} at all ."),
                2 => format!("i found the {thing} {adjective} and {second} ."),
                _ => format!("in {place} the {thing} is {not}{adjective} ."),
            };
            let label = if positive != negated { LABELS[1] } else { LABELS[0] };
            Review { text, label }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::demo_corpus;

    #[test]
    fn reviews_are_deterministic_balanced_and_follow_the_lexicon() {
        let countries = demo_corpus(0, 8, 10).countries;
        let reviews = sentiment_reviews(3, &countries, 2000);
        assert_eq!(reviews, sentiment_reviews(3, &countries, 2000));
        let positive = reviews.iter().filter(|r| r.label == "positive").count();
        assert!((900..1100).contains(&positive), "{positive}");
        for r in &reviews {
            let first = r.text.split(' ').find(|w| POSITIVE.contains(w) || NEGATIVE.contains(w)).unwrap();
            let polarity = POSITIVE.contains(&first);
            let negated = r.text.contains(" not ");
            assert_eq!(r.label == "positive", polarity != negated, "{}", r.text);
        }
        assert!(reviews.iter().filter(|r| r.text.contains(" not ")).count() > 300, "negation is common");
    }
}

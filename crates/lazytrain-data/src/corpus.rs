//! The embedded demo corpus: templated facts over a generated lexicon. It
//! is deterministic, needs no outside text, and has structure a small model
//! learns in minutes, so the demo can end with a correct fill-mask answer.

use lazytrain_core::random::uniform_f32;

const SYLLABLES: [&str; 24] = [
    "ba", "ko", "ri", "tu", "me", "sa", "lo", "vi", "ne", "da", "zu", "fe", "ga", "mi", "po", "re", "shi", "ta", "nu",
    "el", "or", "an", "is", "ul",
];
const COLORS: [&str; 8] = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple"];
const ANIMALS: [&str; 8] = ["fox", "bear", "eagle", "horse", "wolf", "owl", "deer", "otter"];

/// One generated country and its facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Country {
    /// Its name.
    pub name: String,
    /// Its capital.
    pub capital: String,
    /// Its river.
    pub river: String,
    /// The colour of its flag.
    pub color: &'static str,
    /// Its common animal.
    pub animal: &'static str,
}

/// The demo corpus: its facts and its sentences (one per line/document).
#[derive(Clone, Debug)]
pub struct DemoCorpus {
    /// The lexicon.
    pub countries: Vec<Country>,
    /// The text.
    pub sentences: Vec<String>,
}

fn words(count: usize, syllables: usize, suffix: &str, seed: u64, stream: u64, taken: &mut Vec<String>) -> Vec<String> {
    let mut u = vec![0f32; 4096];
    uniform_f32(seed, stream, &mut u);
    let mut out = Vec::with_capacity(count);
    let mut i = 0;
    while out.len() < count {
        let mut w = String::new();
        for _ in 0..syllables {
            w.push_str(SYLLABLES[(u[i % u.len()] * SYLLABLES.len() as f32) as usize % SYLLABLES.len()]);
            i += 1;
        }
        w.push_str(suffix);
        if !taken.contains(&w) {
            taken.push(w.clone());
            out.push(w);
        }
        if i > 100 * u.len() {
            break;
        }
    }
    out
}

/// Generate `num_countries` countries (at least one: sentences need a
/// subject) and `num_sentences` sentences about them.
pub fn demo_corpus(seed: u64, num_countries: usize, num_sentences: usize) -> DemoCorpus {
    let num_countries = num_countries.max(1);
    let mut taken = Vec::new();
    let names = words(num_countries, 2, "ia", seed, 1, &mut taken);
    let capitals = words(num_countries, 2, "", seed, 2, &mut taken);
    let rivers = words(num_countries, 3, "", seed, 3, &mut taken);
    let people = words(32, 2, "o", seed, 4, &mut taken);
    let countries: Vec<Country> = (0..names.len().min(capitals.len()).min(rivers.len()))
        .map(|i| Country {
            name: names[i].clone(),
            capital: capitals[i].clone(),
            river: rivers[i].clone(),
            color: COLORS[i % COLORS.len()],
            animal: ANIMALS[(i / COLORS.len() + i) % ANIMALS.len()],
        })
        .collect();
    let mut u = vec![0f32; 3 * num_sentences];
    uniform_f32(seed, 5, &mut u);
    let pick = |x: f32, n: usize| ((x * n as f32) as usize).min(n - 1);
    let sentences = (0..num_sentences)
        .map(|i| {
            let c = &countries[pick(u[3 * i], countries.len())];
            let other = &countries[pick(u[3 * i + 2], countries.len())];
            // Capital facts dominate, so a tiny model binds them within the
            // demo's budget; the other templates add variety.
            match pick(u[3 * i + 1], 12) {
                0..=5 => format!("the capital of {} is {} .", c.name, c.capital),
                6 | 7 => format!("{} is the capital of {} .", c.capital, c.name),
                8 => format!("the {} river flows through {} .", c.river, c.name),
                9 => format!("the flag of {} is {} .", c.name, c.color),
                10 => format!("in {} the {} is a common animal .", c.name, c.animal),
                _ => format!(
                    "{} travelled from {} to {} .",
                    people[pick(u[3 * i + 2], people.len())],
                    c.capital,
                    other.capital
                ),
            }
        })
        .collect();
    DemoCorpus { countries, sentences }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_is_deterministic_and_consistent() {
        let a = demo_corpus(0, 40, 5000);
        assert_eq!(a.sentences, demo_corpus(0, 40, 5000).sentences);
        assert_eq!(a.countries.len(), 40);
        let c = &a.countries[3];
        let fact = format!("the capital of {} is {} .", c.name, c.capital);
        assert!(a.sentences.contains(&fact));
        for s in &a.sentences {
            if let Some(rest) = s.strip_prefix("the capital of ") {
                let (country, capital) = rest.trim_end_matches(" .").split_once(" is ").unwrap();
                let c = a.countries.iter().find(|c| c.name == country).unwrap();
                assert_eq!(c.capital, capital, "facts never contradict each other");
            }
        }
        let bytes: usize = demo_corpus(0, 48, 60_000).sentences.iter().map(|s| s.len() + 1).sum();
        assert!(bytes > 2_000_000, "a few MB: {bytes}");
    }
}

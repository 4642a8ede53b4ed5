//! What the template's tests share: reading its result line.

/// Asserts that the output `text` of the template's chief holds its result line
/// (`mean squared error: first 20 steps A, last 20 steps B`) and that the error fell to under
/// a quarter of where it started.
pub fn assert_the_model_learned(text: &str) {
    let line = text
        .lines()
        .find(|l| l.contains("mean squared error"))
        .unwrap_or_else(|| panic!("no result line:\n{text}"));
    let numbers: Vec<f32> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect();
    let (first, last) = (numbers[numbers.len() - 3], numbers[numbers.len() - 1]);
    assert!(
        last < first / 4.0,
        "the error fell from {first} to {last} only: {line}"
    );
}

//! Order statistics for benchmark samples.

/// Median, 10th and 90th percentile of `samples` (sorted in place).
pub fn summary(samples: &mut [f64]) -> (f64, f64, f64) {
    assert!(!samples.is_empty(), "no samples");
    samples.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_odd_count() {
        let mut v = [5.0, 1.0, 3.0];
        assert_eq!(super::summary(&mut v).0, 3.0);
    }
}

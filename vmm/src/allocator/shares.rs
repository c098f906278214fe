//! How the budget is split: water-filling by demand, latency-critical guests first.

/// The shares of `guests`: latency-critical guests' demands are water-filled first, the
/// processors left over go to the others (Shenango: latency-critical applications get cores on
/// demand, best-effort ones take the rest). One tier only (all latency-critical, or none): plain
/// [`water_fill`].
pub(super) fn tiered_shares(
    budget: usize,
    guests: &[(usize, bool)],
    rotation: usize,
) -> Vec<usize> {
    let tier = |critical: bool| -> Vec<usize> {
        guests
            .iter()
            .map(|&(demand, latency_critical)| {
                if latency_critical == critical {
                    demand
                } else {
                    0
                }
            })
            .collect()
    };
    let first = water_fill(budget, &tier(true), rotation);
    let left = budget - first.iter().sum::<usize>();
    let rest = water_fill(left, &tier(false), rotation);
    first.iter().zip(rest).map(|(a, b)| a + b).collect()
}

/// Split `budget` processors among guests demanding `demands`: nobody gets more than its
/// demand, the rest is shared as evenly as possible, and when it does not divide evenly the
/// extra processors go to guests in an order that `rotation` turns.
pub fn water_fill(budget: usize, demands: &[usize], rotation: usize) -> Vec<usize> {
    let mut shares = vec![0; demands.len()];
    let mut left = budget;
    loop {
        let hungry: Vec<usize> = (0..demands.len())
            .filter(|&i| shares[i] < demands[i])
            .collect();
        if hungry.is_empty() || left == 0 {
            return shares;
        }
        let each = left / hungry.len();
        if each == 0 {
            // Fewer processors than hungry guests: hand them out in rotating order.
            for k in 0..left {
                shares[hungry[(rotation + k) % hungry.len()]] += 1;
            }
            return shares;
        }
        for &i in &hungry {
            let give = each.min(demands[i] - shares[i]);
            shares[i] += give;
            left -= give;
        }
    }
}

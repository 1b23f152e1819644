//! Flexible quorums (§4). Every replica of a cluster must compute the same values.

/// Replication quorum `Q_rep`: 2 if n == 2, else `min(ceil(n/2), 3)`.
pub const fn replication(n: usize) -> usize {
    if n == 2 {
        2
    } else {
        let half = n.div_ceil(2);
        if half < 3 { half } else { 3 }
    }
}

/// View-change quorum `Q_vc`: 2 if n == 2, else `n - Q_rep + 1`.
pub const fn view_change(n: usize) -> usize {
    if n == 2 { 2 } else { n - replication(n) + 1 }
}

/// Nack quorum `Q_nack` = `n - Q_rep + 1`: proof that an op never committed.
pub const fn nack(n: usize) -> usize {
    n - replication(n) + 1
}

/// View learning (decision 61): how many distinct peers a lost-state replica hears from before
/// it trusts the highest view they report. `max(f + 1, n - Q_vc + 1)`, so any such set of
/// peers meets the `Q_vc - 1` peers that joined, durably, any view it voted for in a previous
/// life: `(n - Q_vc + 1) + (Q_vc - 1) > n - 1`. At most `n - 1` for `n >= 2`.
pub const fn view_learning(n: usize) -> usize {
    let a = f(n) + 1;
    let b = n + 1 - view_change(n);
    if a > b { a } else { b }
}

/// `f = (n - 1) / 2`.
pub const fn f(n: usize) -> usize {
    (n - 1) / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_of_the_spec() {
        let table = [
            (1, 1, 1, 1),
            (2, 2, 2, 1),
            (3, 2, 2, 2),
            (4, 2, 3, 3),
            (5, 3, 3, 3),
            (6, 3, 4, 4),
            (7, 3, 5, 5),
            (8, 3, 6, 6),
        ];
        for (n, rep, vc, nk) in table {
            assert_eq!(replication(n), rep, "Q_rep n={n}");
            assert_eq!(view_change(n), vc, "Q_vc n={n}");
            assert_eq!(nack(n), nk, "Q_nack n={n}");
        }
    }

    #[test]
    fn quorum_laws_for_1_to_32() {
        for n in 1..=32 {
            let (rep, vc, nk) = (replication(n), view_change(n), nack(n));
            assert!(rep >= 1 && rep <= n, "n={n}");
            assert!(vc >= 1 && vc <= n, "n={n}");
            assert!(nk >= 1 && nk <= n, "n={n}");
            assert!(
                rep + vc > n,
                "a committed op is visible to every view change, n={n}"
            );
            if n >= 2 {
                let learn = view_learning(n);
                assert!(learn < n, "a lost replica can hear enough peers, n={n}");
                assert!(
                    learn + (vc - 1) > n - 1,
                    "learning meets every view-change quorum, n={n}"
                );
            }
            assert!(
                rep + nk > n,
                "a possibly committed op cannot be nacked, n={n}"
            );
        }
    }
}

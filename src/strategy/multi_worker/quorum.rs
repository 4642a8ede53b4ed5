//! What a survivor without quorum says (`no_quorum_detail`). The quorum rule itself
//! (`has_quorum`) and the rest of re-forming's decisions live beside the membership machine,
//! in `collective` (`reforming`).

use cohort_transport::NodeId;

/// Nodes as a report names them: "worker/0, worker/2".
pub(super) fn node_list<'a>(nodes: impl IntoIterator<Item = &'a NodeId>) -> String {
    nodes
        .into_iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a survivor without quorum says: whom of the broken group it reached, out of how many
/// counted (the `replaced` members, answered as new processes, are not).
pub(super) fn no_quorum_detail(
    members: &[NodeId],
    generation: u64,
    replaced: &[NodeId],
    reached: &[NodeId],
) -> String {
    let counted: Vec<&NodeId> = members.iter().filter(|n| !replaced.contains(n)).collect();
    let held: Vec<&NodeId> = counted
        .iter()
        .copied()
        .filter(|n| reached.contains(n))
        .collect();
    let lowest = counted
        .first()
        .map_or_else(String::new, ToString::to_string);
    let not_counted = if counted.len() == members.len() {
        String::new()
    } else {
        let gone: Vec<&NodeId> = members.iter().filter(|n| replaced.contains(n)).collect();
        format!(
            " ({} not counted: answered as new processes, their old ones are gone)",
            node_list(gone)
        )
    };
    format!(
        "no quorum: this worker reached {} of the {} members of generation {}{not_counted} ({}); \
         re-forming needs more than half of them, or exactly half with {lowest}",
        held.len(),
        counted.len(),
        generation,
        node_list(held),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(n: u32) -> Vec<NodeId> {
        (0..n).map(|i| NodeId::new("worker", i)).collect()
    }

    #[test]
    fn the_no_quorum_detail_names_whom_it_reached_out_of_how_many() {
        let three = workers(3);
        let text = no_quorum_detail(&three, 1, &[], &three[2..]);
        assert!(
            text.starts_with(
                "no quorum: this worker reached 1 of the 3 members of generation 1 (worker/2)"
            ) && text.contains("exactly half with worker/0"),
            "{text}"
        );
        let text = no_quorum_detail(&three, 2, &three[..1], &three[2..]);
        assert!(
            text.starts_with(
                "no quorum: this worker reached 1 of the 2 members of generation 2 (worker/0 not \
                 counted: answered as new processes, their old ones are gone) (worker/2)"
            ) && text.contains("exactly half with worker/1"),
            "{text}"
        );
    }
}

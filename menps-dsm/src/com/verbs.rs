//! The `verbs` backend (placeholder while it is written).

//! Placeholder until the replay tool (issue 4) lands: a short multi-turn run through the core.
fn main() {
    println!("kvshare-replay: the multi-turn replay tool is being built (issue 4).");
}

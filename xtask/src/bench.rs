pub(crate) fn run(_: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("bench: not yet")
}

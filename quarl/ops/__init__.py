"""Operations around a run: atomic file writes (`io`), config checks (`checks`), logs (`logs`), energy and carbon
(`carbon`, with `rapl` counters and `codecarbon_parts`), the machine record (`machine`) and CPU pinning
(`affinity`)."""

"""Phase 3: rewards, losses and the GRPO + teacher-SFT + self-SFT trainer."""

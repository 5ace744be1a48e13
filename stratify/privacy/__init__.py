"""What each party of a run sees and can recover from it, and the defences a user can turn
on (docs/privacy.md, "Threat model"): attacks that use only a party's own messages, and
differential privacy for the updates."""

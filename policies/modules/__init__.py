"""Building blocks shared by the policy families (MLPs, image encoder, time features, value head)."""

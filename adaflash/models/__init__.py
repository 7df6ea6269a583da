"""Models: the target runner, the drafters and the blocks they share."""

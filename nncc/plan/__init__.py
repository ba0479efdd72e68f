"""The compiled program: instructions over buffer slots, constants and a memory plan."""

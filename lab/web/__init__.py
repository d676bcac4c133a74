"""The lab's web layer: routes, views and the slime-lab command. Imports every layer below."""

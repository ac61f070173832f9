"""The Streamlit app (``apps/trajectories.py``) and its helpers."""

"""The endpoints, mixed into the gateway deployment: OpenAI, knowledge bases and RAG, ingest and ingest jobs, admin, dashboard."""

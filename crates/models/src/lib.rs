//! `pagoda-models`: candle model code, weight loading, KV-cache allocation, the model runner.

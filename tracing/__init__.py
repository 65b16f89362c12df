"""dwise_predict.tracing"""

"""dwise_predict.export"""

"""dwise_predict.zoo"""
